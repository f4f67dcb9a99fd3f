// evenep/cuda/expert_ops.hpp — functional device operations over caller-owned memory and the plan as a tensor: what
// a framework binding (the PyTorch package, python/csrc) needs around cuda::Ep and cuda::Experts to keep its own
// tensors — packing the plan and the handle, moving receive rows, the grouped GEMM's weight tables with the copies,
// prefetch and reduction of copies where every rank is in this process (the same functions serve cuda::Experts on
// the local team), and the weighted combine's row backward.
//
// The plan tensor: int32 [rows, width], row i = one rank's share of the plan in the columns of evenep::plan_columns
// (evenep/plan_tensor.hpp; PlanRowLayout names the ones read here). A PlanRows names such a tensor on the device. The
// functions read it on the device: nothing is synchronised with the host.
//
// Contract of every function: asynchronous on `stream` (last parameter), allocates nothing, graph capturable,
// checks its arguments on the host (throws evenep::Error naming the value) and the launch (cudaGetLastError). The
// functions that take an Ep act for its served ranks [ep.rank_begin(), + ep.num_local_ranks()) = L ranks: row i of
// their outputs is rank rank_begin + i.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "evenep/cuda/ep.hpp"
#include "evenep/plan_tensor.hpp"

namespace evenep::cuda {

// A plan tensor on the device: [rows, layout.width] int32.
struct PlanRows {
    const int32_t* data = nullptr;
    int rows = 0;
    PlanRowLayout layout{};
};

// ---- the Ep's resident plan and receive buffers ----

// plan [L, plan_row_width] int32 from each served rank's copy of the resident plan (int8 values sign-extended):
// bit-identical to evenep::pack_plan_row of the same plan.
void pack_plan(const Ep& ep, int32_t* plan, cudaStream_t stream);

// The inverse of pack_plan and pack_handle: a new resident plan of `ep` (Ep::adopt_plan) whose arrays are written
// from the plan tensor and a dispatch handle, without planning — what combine, combine_backward, dispatch_backward
// (and, with every_rank, cuda::Experts) then read. Row i of the plan goes into served rank rank_begin + i's share
// of every plan array (int8 values narrowed back), row i of the handle into that rank's dst. The plan's token
// counts are s_pad for every rank (the handle masks the entries past s_r: the data-path calls move the same rows;
// combine writes zero rows for those tokens). The shares of the ranks not served here are left as they are unless
// every_rank: each row is then also written into every rank's buffer (the peers' through the team's window), so
// that every rank's copy of the arrays that span the group (copies [R*B], read by cuda::Experts) is whole; on the
// NCCL team the caller first makes sure no peer still reads its plan arrays (a team barrier).
struct UnpackPlanArgs {
    PlanRows plan;                    // [L, plan_row_width]: the served ranks' rows
    const int32_t* handle = nullptr;  // [L, s_pad*K] encoded destinations (dispatch's handle); null: dst not written
    int64_t s_pad = 1;                // 1..S: the handle's tokens per rank
    bool every_rank = false;
};
EpPlan unpack_plan(Ep& ep, const UnpackPlanArgs& args, cudaStream_t stream);

// handle [L, s_pad*K] int32: each served rank's encoded destinations (SPEC §3.4) for its first s_r tokens of the
// resident plan, INT32_MIN (detail::kMaskedDst) after them.
void pack_handle(const Ep& ep, int32_t* handle, int64_t s_pad, cudaStream_t stream);

// recv_x [L, NvS, H] bf16 and recv_w [L, NvS] fp32 (each when non-null) from the served ranks' buffers: the rows
// before the resident plan's last group end (cu_seqlens[G-1]) are copied, the others are zero.
void gather_recv(const Ep& ep, uint16_t* recv_x, float* recv_w, cudaStream_t stream);

// rows [L, NvS, H] bf16 into the served ranks' receive rows (all NvS: expert outputs, row gradients).
void scatter_recv(const Ep& ep, const uint16_t* rows, cudaStream_t stream);

// ---- the grouped GEMM's tables (evenep/cuda/grouped_gemm.hpp) ----

// One grouped GEMM over the receive rows of all plan rows at once: rows*(G+1) groups, row i's G groups, then one
// gap group (rows cu_seqlens[G-1] .. NvS, a null pointer: not computed).
struct GroupTableArgs {
    PlanRows plan;
    int64_t nvs = 0;              // receive rows per rank (x is [rows*NvS, in])
    int expert_base = 0;          // global id of home[0] (0 with every expert's weights in home; rank*E/R with one)
    int num_home = 0;             // matrices in home
    const void* home = nullptr;   // [num_home] matrices of mat_bytes: the home experts' weights (or gradients)
    const void* slots = nullptr;  // [rows, B] matrices: the prefetch slots (or their gradients)
    int64_t mat_bytes = 0;
    const void** table = nullptr;  // out: device [rows*(G+1)]
    int32_t* cu = nullptr;         // out: device [rows*(G+1)]; null: not written
    // Ranks whose matrices are separate allocations (cuda::MoeLayer): device arrays replacing home and slots per
    // row — row i's home matrices homes[i] (global ids expert_base + i*num_home, ...) and its slots row_slots[i]
    // (either may hold null: that row's groups get null) — and, optionally, peers [num_peers]: every rank's home
    // matrices, for the groups whose expert lies outside the row's home range (kPeer reads of ranks with B < E/R).
    const void* const* homes = nullptr;
    const void* const* row_slots = nullptr;
    const void* const* peers = nullptr;
    int num_peers = 0;
};
//   table[i*(G+1) + g]  kLocal, kPeer -> home + (expert - expert_base) * mat_bytes when that index is in
//                       [0, num_home) (homes: homes[i] + (expert - expert_base - i*num_home) * mat_bytes), else
//                       with peers peers[expert / num_home] + (expert % num_home) * mat_bytes, else null;
//                       kSlot -> slots + (i*B + slot) * mat_bytes (row_slots: row_slots[i] + slot * mat_bytes)
//                       for a slot in [0, B); kEmpty and the gap -> null;
//   cu[i*(G+1) + g]     i*NvS + cu_seqlens[i][g]; the gap group's end (i+1)*NvS.
// The grouped GEMM of the PyTorch ops (one launch over every row) and the MoE layer (one per rank: row i's first
// G entries with its own cu_seqlens) both take their tables from here.
void build_group_table(const GroupTableArgs& args, cudaStream_t stream);

// ---- copies of experts (prefetch slots) and their gradients, every rank in this process ----

// out[i, b] = copies[i][b] >= 0 ? in[i, b] : 0 for the plan's rows (mat_bytes per slot, a multiple of 16).
void select_slots(const PlanRows& plan, const void* in, void* out, int64_t mat_bytes, cudaStream_t stream);

// A region of matrices of each rank: rank r's matrix i at (bases ? bases[r] : base + r * rank_stride) + offset +
// i * mat_bytes (ExpertCopies::mat_bytes). bases: a device table [R] (a team window's d_peers, one allocation per
// rank: cuda::Experts); else one allocation holding every rank's matrices (a tensor).
struct RankMatrices {
    char* const* bases = nullptr;
    char* base = nullptr;
    int64_t rank_stride = 0;
    size_t offset = 0;
};

// The copies table and the matrices it moves: slot b of rank r holds expert copies[r][b] (-1: none), whose home is
// matrix e % epn of rank e / epn in `home`; the slot is matrix b of rank r in `slots`. Every rank's matrices are
// addressable from this process (the local team's windows, or tensors): cuda::Experts on the local team and the
// PyTorch ops' virtual ranks both move copies through these two functions.
struct ExpertCopies {
    const int32_t* copies = nullptr;  // device: row r's B entries at copies + r * copies_stride
    int64_t copies_stride = 0;
    int R = 0, B = 0, E = 0, epn = 0;
    RankMatrices home, slots;
    int64_t mat_bytes = 0;  // a multiple of 16 for the 16-byte paths (prefetch: any size; reduce: fp32 matrices)
    // The copies of a plan tensor's rows (every rank) over one allocation of home matrices [E] and one of slots
    // [rows, B].
    static ExpertCopies of_tensors(const PlanRows& plan, const void* home, void* slots, int64_t mat_bytes);
};

// slots(r)[b] = home matrix of copies[r][b] for every row and slot; a slot without a copy is zeroed with zero_empty,
// else not written. One kernel; each block walks the used slots (staged in shared memory) and copies its share of
// each with 16-byte loads (a matrix's grid, so empty slots cost nothing).
void prefetch_copies(const ExpertCopies& c, bool zero_empty, cudaStream_t stream);

// For every expert e with copies (fp32 matrices, mat_bytes / 4 elements): g = (accumulate ? home(e) : 0), then
// g += slots(r)[b] for each (r, b) with copies[r][b] == e in ascending (rank, slot) order, home(e) = g — the order
// of the CPU backend (cpu::ExpertPool) and of cuda::Experts on any team: bit for bit. Without accumulate the experts
// without copies get 0, with it they are not touched. zero_consumed: the slots read are zeroed (cuda::Experts'
// contract). One kernel.
void reduce_copies(const ExpertCopies& c, bool accumulate, bool zero_consumed, cudaStream_t stream);

// ---- the weighted combine's backward ----

// Per receive row n of each plan row i before its groups' end (cu_seqlens[G-1]), in the order of
// evenep/detail/row_grad.hpp (the MoE layer's kernel, src/cuda/kernels/swiglu.cu): rows = bf16(recv_w * rows) in
// place and grad_w = <rows, y> (fp32); grad_w = 0 past the groups, where rows are left as they are.
struct WeightRowsArgs {
    PlanRows plan;
    int64_t nvs = 0;
    int H = 0;                    // multiple of 8
    uint16_t* rows = nullptr;     // [rows, NvS, H] bf16, in/out
    const uint16_t* y = nullptr;  // [rows, NvS, H] bf16
    const float* recv_w = nullptr;  // [rows, NvS]
    float* grad_w = nullptr;        // [rows, NvS] out
};
void weight_rows(const WeightRowsArgs& args, cudaStream_t stream);

}  // namespace evenep::cuda
