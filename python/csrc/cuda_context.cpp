// python/csrc/cuda_context.cpp — CudaContext (cuda_context.hpp), the helpers of the CUDA ops and the CUDA buffer
// ops (create_cuda_buffer, release_cuda_buffer, check_cuda_buffer). The op kernels are in ops_cuda.cpp.
//
#include "cuda_context.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "evenep/cuda/check.hpp"

namespace evenep::python {

// ---- CudaContext ----

CudaContext::CudaContext(
    const BufferConfig& cfg, PlannerMode mode, int device, int num_sms, const cuda::NcclBootstrap* boot)
    : cfg_(cfg), device_(device), layout_(PlanRowLayout::make(cfg.cfg)) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cuda::TeamOptions to;
    to.device = device;
    if (boot) {
        EVENEP_CHECK(boot->world_size == cfg.cfg.R, "evenep.Buffer(group=...): world size ", boot->world_size,
                     " but R = ", cfg.cfg.R);
        EVENEP_CHECK(cfg.cfg.num_slots() >= cfg.cfg.E / cfg.cfg.R,
                     "evenep.Buffer(group=...): prefetch_slots = ", cfg.cfg.num_slots(),
                     " < E/R = ", cfg.cfg.E / cfg.cfg.R,
                     " is not supported (the expert ops would need the peers' weights directly)");
        team_ = std::make_unique<cuda::NcclTeam>(*boot, 256, to);  // the Ep allocates its own windows
        nccl_ = true;
    } else {
        team_ = std::make_unique<cuda::LocalTeam>(cfg.cfg.R, 0, to);
    }
    cuda::EpOptions eo;
    eo.mode = mode;
    eo.sm_budget = num_sms;
    eo.team = to;
    eo.precision = cfg.precision;  // fp8: the FP8 dispatch (ops_fp8_cuda.cpp)
    if (cfg.cfg.policy == PlannerPolicy::kAuto) eo.auto_model = layer_auto_cost_model(cfg);
    ep_ = std::make_unique<cuda::Ep>(*team_, cfg.cfg, cfg.H, eo);
    const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, device);
    scratch_ = at::zeros({L(), cfg.cfg.S, cfg.H}, opts);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());  // the buffers are initialised before any stream uses them
}

CudaContext::~CudaContext() {
    // Work of this buffer may still be queued on torch's streams; the Ep frees its memory with cudaFree, which waits.
    last_ = {};
    experts_.clear();
    ep_.reset();
    team_.reset();
}

void CudaContext::peer_barrier(cudaStream_t stream, int channel) {
    if (auto* t = dynamic_cast<cuda::NcclTeam*>(team_.get())) t->device_barrier(stream, channel);
}

cuda::Experts& CudaContext::experts(int64_t elems, bool grads, bool capturing) {
    auto& e = experts_[{elems, grads}];
    if (!e) {
        // A new pool allocates windows (ncclMemAlloc / cudaMalloc): not inside a graph capture.
        TORCH_CHECK(!capturing, "evenep: the first ", grads ? "reduce_grad" : "prefetch_weight",
                    " of this matrix size on a group= buffer allocates its pool: run it once before capturing");
        cuda::ExpertsShape shape;
        shape.num_projections = 1;
        shape.elems = elems;
        shape.with_weights = !grads;
        shape.with_grads = grads;
        e = std::make_unique<cuda::Experts>(*ep_, shape);
    }
    return *e;
}

void CudaContext::surface_errors(cudaStream_t stream, bool sync) {
    std::string what;
    ErrorKind kind = ErrorKind::kRuntime;
    try {
        if (sync) {
            ep_->check(stream);
        } else {
            what = team_->pending_error();
            if (what.empty()) return;
            // Not while capturing a graph (a synchronisation would invalidate the capture): raise the record as is.
            if (stream_capturing(stream)) TORCH_CHECK(false, "evenep: an earlier call failed on the device: ", what);
            ep_->check(stream);  // the record is set: synchronise and throw the error as the team reports it
        }
        return;
    } catch (const Error& e) {
        what = e.what();
        kind = e.kind();
    }
    team_->recover();  // the buffer stays usable; plans made by the failing call are garbage: plan again
    drop_last_plan();
    if (kind == ErrorKind::kInvalidArgument) TORCH_CHECK_VALUE(false, what);
    TORCH_CHECK(false, what);
}

cuda::EpPlan CudaContext::last_plan(const at::Tensor& t) const {
    if (!last_.plan.valid() || !last_.tensor.is(t) || tensor_version(t) != last_.version ||
        !ep_->is_resident(last_.plan))
        return {};
    return last_.plan;
}

void CudaContext::set_last_plan(const at::Tensor& t, cuda::EpPlan plan) {
    last_.tensor = TensorKey::of(t);
    last_.version = tensor_version(t);
    last_.plan = std::move(plan);
}

cuda::EpPlan CudaContext::unpack(const at::Tensor& plan, const int32_t* handle, int64_t s_pad, cudaStream_t stream) {
    if (handle == nullptr) {
        cuda::EpPlan p = last_plan(plan);
        if (p.valid()) return p;
    }
    drop_last_plan();
    cuda::UnpackPlanArgs a;
    a.plan = plan_rows(plan, L());
    a.handle = handle;
    a.s_pad = s_pad;
    a.every_rank = handle == nullptr;
    return cuda::unpack_plan(*ep_, a, stream);
}

namespace {

std::mutex g_mutex;
// Never destroyed: buffers still registered at exit are leaked rather than freed after torch's allocator and the
// CUDA runtime are gone.
auto& g_contexts = *new std::map<int64_t, std::shared_ptr<CudaContext>>;

std::shared_ptr<CudaContext> context(int64_t id, const char* op) {
    std::lock_guard lock(g_mutex);
    auto it = g_contexts.find(id);
    TORCH_CHECK_VALUE(it != g_contexts.end(), "evenep.", op, ": no CUDA buffer with id ", id,
                      " (released, never created, or a CPU buffer given CUDA tensors)");
    return it->second;
}

}  // namespace

bool stream_capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    EVENEP_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
    return cs != cudaStreamCaptureStatusNone;
}

OpScope::OpScope(int64_t id, const char* op)
    : ctx(context(id, op)),
      lock(ctx->mutex()),
      guard(static_cast<c10::DeviceIndex>(ctx->device())),
      stream(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(ctx->device())).stream()),
      capturing(stream_capturing(stream)) {
    ctx->surface_errors(stream, false);
}

void check_cuda(const CudaContext& ctx,
                const at::Tensor& t,
                const char* op,
                const char* name,
                at::ScalarType dtype,
                std::initializer_list<int64_t> sizes) {
    check_tensor(t, op, name, dtype, sizes, c10::DeviceType::CUDA);
    TORCH_CHECK_VALUE(t.device().index() == ctx.device(), "evenep.", op, ": ", name, " is on ", t.device(),
                      ", the buffer on cuda:", ctx.device());
}

void check_home(const CudaContext& ctx, const at::Tensor& w, const char* op, const char* name, at::ScalarType dtype) {
    TORCH_CHECK_VALUE(w.dim() == 3 && w.size(0) == ctx.num_home(), "evenep.", op, ": ", name, " has shape ", w.sizes(),
                      ", expected [", ctx.multi_process() ? "E/R = " : "E = ", ctx.num_home(), ", in, out]");
    check_cuda(ctx, w, op, name, dtype, {w.size(0), w.size(1), w.size(2)});
}

// topk_idx as int32 on the device. int64 ids are clamped to int32's range first (never wrapping into [-1, E)), so
// the device check reports a bad id as given (-5 as -5; past int32 as the int32 bound): an asynchronous error,
// surfaced by the next call or Buffer.check().
at::Tensor topk_int32(const CudaContext& ctx, const at::Tensor& topk_idx, const char* op) {
    const int64_t s = topk_idx.dim() == 3 ? topk_idx.size(1) : -1;
    TORCH_CHECK_VALUE(topk_idx.scalar_type() == at::kInt || topk_idx.scalar_type() == at::kLong, "evenep.", op,
                      ": topk_idx has dtype ", topk_idx.scalar_type(), ", expected int32 or int64");
    check_cuda(ctx, topk_idx, op, "topk_idx", topk_idx.scalar_type(), {ctx.L(), s, ctx.cfg().K});
    if (topk_idx.scalar_type() == at::kInt) return topk_idx;
    return topk_idx.clamp(INT32_MIN, INT32_MAX).to(at::kInt);
}

namespace {

// ---- buffer management ----

int64_t register_context(std::shared_ptr<CudaContext> ctx) {
    const int64_t id = new_buffer_id();
    std::lock_guard lock(g_mutex);
    g_contexts[id] = std::move(ctx);
    return id;
}

// A new CudaContext. A constructor that failed (out of device memory: torch.OutOfMemoryError, see translate) leaves
// its CUDA error as the thread's last error: cleared here, or the next launch check (ours or torch's) of any buffer
// would report it again.
std::shared_ptr<CudaContext> new_context(const BufferConfig& cfg,
                                         const std::string& planner,
                                         int64_t device,
                                         int64_t num_sms,
                                         const cuda::NcclBootstrap* boot) {
    try {
        return std::make_shared<CudaContext>(cfg, parse_planner_mode(planner), static_cast<int>(device),
                                             static_cast<int>(num_sms), boot);
    } catch (...) {
        (void)cudaGetLastError();
        throw;
    }
}

int64_t create_cuda_buffer(int64_t num_ranks,
                           int64_t num_experts,
                           int64_t top_k,
                           int64_t max_tokens,
                           int64_t hidden,
                           int64_t ffn_hidden,
                           int64_t num_slots,
                           int64_t token_padding,
                           std::string planner,
                           int64_t device,
                           int64_t num_sms,
                           std::string policy,
                           double slack,
                           bool fp8,
                           bool ue8m0,
                           bool bf16_partials) {
    return translate([&] {
        const BufferConfig cfg =
            make_buffer_config(num_ranks, num_experts, top_k, max_tokens, hidden, ffn_hidden, num_slots, token_padding,
                               policy, slack, DataPrecision{fp8, ue8m0, bf16_partials});
        return register_context(new_context(cfg, planner, device, num_sms, nullptr));
    });
}

// group=: this process's rank of a group of `world_size` processes over EvenEP's NCCL team, bootstrapped from the
// NCCL unique id (hex) that rank 0 made with nccl_unique_id() and the caller broadcast over its process group.
// config: [E, K, S, H, H', B, tp] as create_cuda_buffer's.
int64_t create_nccl_buffer(at::IntArrayRef config,
                           std::string planner,
                           std::string unique_id,
                           int64_t rank,
                           int64_t world_size,
                           int64_t device,
                           int64_t num_sms,
                           std::string policy,
                           double slack,
                           bool fp8,
                           bool ue8m0,
                           bool bf16_partials) {
    return translate([&] {
        EVENEP_CHECK(cuda::nccl_team_built(),
                     "evenep.Buffer(group=...): this build of evenep has no NCCL team (built without NCCL >= 2.28 "
                     "with nccl_device.h; see docs/python.md)");
        TORCH_CHECK_VALUE(config.size() == 7, "evenep.create_nccl_buffer: config has ", config.size(),
                          " values, expected [E, K, S, H, H', B, tp]");
        const BufferConfig cfg =
            make_buffer_config(world_size, config[0], config[1], config[2], config[3], config[4], config[5], config[6],
                               policy, slack, DataPrecision{fp8, ue8m0, bf16_partials});
        cuda::NcclBootstrap boot;
        boot.rank = static_cast<int>(rank);
        boot.world_size = static_cast<int>(world_size);
        boot.local_rank = static_cast<int>(device);
        boot.unique_id = std::move(unique_id);
        return register_context(new_context(cfg, planner, device, num_sms, &boot));
    });
}

std::string nccl_unique_id() {
    return translate([&] {
        EVENEP_CHECK(cuda::nccl_team_built(),
                     "evenep.Buffer(group=...): this build of evenep has no NCCL team (built without NCCL >= 2.28 "
                     "with nccl_device.h; see docs/python.md)");
        return cuda::nccl_new_unique_id();
    });
}

bool nccl_built() { return cuda::nccl_team_built(); }

void release_cuda_buffer(int64_t id) {
    std::shared_ptr<CudaContext> ctx;
    {
        std::lock_guard lock(g_mutex);
        auto it = g_contexts.find(id);
        if (it == g_contexts.end()) return;
        ctx = std::move(it->second);
        g_contexts.erase(it);
    }
}

std::vector<int64_t> cuda_buffer_info(int64_t id) {
    std::shared_ptr<CudaContext> ctx;
    {
        std::lock_guard lock(g_mutex);
        auto it = g_contexts.find(id);
        if (it == g_contexts.end()) return {};
        ctx = it->second;
    }
    return buffer_info_of(ctx->buffer_config(), ctx->L(), ctx->rank_begin());
}

// Synchronises the buffer's current stream and raises what the device recorded (bad expert ids), recovering.
void check_cuda_buffer(int64_t id) {
    translate([&] {
        OpScope sc(id, "check");
        sc.ctx->surface_errors(sc.stream, true);
    });
}

struct Registrar {
    Registrar() { set_cuda_buffer_info_hook(&cuda_buffer_info); }
} g_registrar;

}  // namespace

}  // namespace evenep::python

TORCH_LIBRARY_FRAGMENT(evenep, m) {
    using namespace evenep::python;
    m.def(
        "create_cuda_buffer(int num_ranks, int num_experts, int top_k, int max_tokens, int hidden, int ffn_hidden, "
        "int num_slots, int token_padding, str planner, int device, int num_sms, str policy=\"auto\", "
        "float slack=-1., bool fp8=False, bool ue8m0=False, bool bf16_partials=False) -> int",
        &create_cuda_buffer);
    m.def(
        "create_nccl_buffer(int[] config, str planner, str unique_id, int rank, int world_size, int device, "
        "int num_sms, str policy=\"auto\", float slack=-1., bool fp8=False, bool ue8m0=False, "
        "bool bf16_partials=False) -> int",
        &create_nccl_buffer);
    m.def("nccl_unique_id() -> str", &nccl_unique_id);
    m.def("nccl_built() -> bool", &nccl_built);
    m.def("release_cuda_buffer(int buffer) -> ()", &release_cuda_buffer);
    m.def("check_cuda_buffer(int buffer) -> ()", &check_cuda_buffer);
}
