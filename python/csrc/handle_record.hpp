// python/csrc/handle_record.hpp — which dispatch handles a buffer handed out (HandleRecords), so that combine,
// combine_backward(_weighted) and dispatch_backward refuse a handle that dispatch did not make for their plan: changed
// after dispatch, made by another buffer, or built by hand. Used by the CPU ops (context.hpp) and the CUDA ops
// (cuda_context.hpp); docs/python.md, "Handles".
//
// Two ways to recognise a handle, chosen by where its values live:
//   host (CPU ops, whose kernels read the destinations in dst): by value — the handle's bytes hash to, and equal, a
//       recorded handle whose tensor is still alive, with a plan equal to the call's. A handle changed in place no
//       longer matches; an out-of-range or negative destination can never reach the kernels.
//   device (CUDA ops, whose kernels read dst on the device: combine and the backward make their plan resident from
//       the plan tensor and the handle, cuda::unpack_plan): by identity — the same tensor (storage and data pointer)
//       at the same version counter (`tensor._version`, bumped by every in-place write) with the same plan tensor,
//       read without any host synchronisation; a copy (opcheck, .clone()) is matched by value outside CUDA-graph
//       capture only (a synchronisation). What still reaches a kernel (an inference-mode handle, which has no
//       version counter, written in place) cannot address memory outside the buffers: unpack_plan masks any
//       destination outside the group's rows.
// Records die with their handle tensors (weakly held): a handle is valid exactly while dispatch's output is alive.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Storage.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace evenep::python {

// A tensor's identity: its storage (weakly held, so the address is never reused while the key lives) and data.
struct TensorKey {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{
        c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>())};
    const void* data = nullptr;

    static TensorKey of(const at::Tensor& t) {
        auto strong = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(t.storage().unsafeGetStorageImpl());
        return {c10::weak_intrusive_ptr<c10::StorageImpl>(strong), t.data_ptr()};
    }
    bool alive() const { return data != nullptr && !storage.expired(); }
    bool is(const at::Tensor& t) const {
        return alive() && storage._unsafe_get_target() == t.storage().unsafeGetStorageImpl() && data == t.data_ptr();
    }
};

// A tensor's version counter (bumped by every in-place write); -1 for inference tensors, which keep none.
inline int64_t tensor_version(const at::Tensor& t) {
    return t.is_inference() ? -1 : static_cast<int64_t>(t._version());
}

// FNV-1a over a contiguous host tensor's bytes.
inline uint64_t host_hash(const at::Tensor& t) {
    const auto* p = static_cast<const unsigned char*>(t.data_ptr());
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0, n = t.numel() * t.element_size(); i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

class HandleRecords {
  public:
    // host: the handles' values are read by the kernels (CPU): recognise them by value; else by identity (CUDA).
    explicit HandleRecords(bool host) : host_(host) {}

    // Records `handle`, just made by a dispatch of `plan` (plan_value: the plan's content, a tensor that is not
    // written again; on the host a copy is taken here).
    void add(const at::Tensor& handle, const at::Tensor& plan, const at::Tensor& plan_value) {
        std::erase_if(entries_, [](const Entry& e) { return !e.handle.alive(); });
        Entry e;
        e.handle = TensorKey::of(handle);
        e.version = tensor_version(handle);
        e.plan = TensorKey::of(plan);
        e.value = handle.clone();
        e.plan_value = host_ ? plan_value.clone() : plan_value;
        if (host_) e.hash = host_hash(e.value);
        entries_.push_back(std::move(e));
    }

    // Raises ValueError unless `handle` (checked [L, s*K] int32 on the buffer's device) is a handle recorded here
    // for a plan equal to `plan`, unchanged since dispatch made it. capturing: a CUDA graph is being captured (no
    // value comparison: it would synchronise).
    void check(const at::Tensor& handle, const at::Tensor& plan, bool capturing, const char* op) const {
        if (host_ ? match_host(handle, plan) : match_device(handle, plan, capturing, op)) return;
        TORCH_CHECK_VALUE(false, "evenep.", op,
                          ": the handle was not made by this buffer's dispatch of this plan, or was changed since "
                          "(a handle is valid, unchanged, while the tensors dispatch returned are alive)",
                          capturing ? "; copies of handles are not recognised during CUDA-graph capture" : "");
    }

  private:
    struct Entry {
        TensorKey handle, plan;
        int64_t version = -1;
        at::Tensor value, plan_value;  // the handle's content when made, its plan's content
        uint64_t hash = 0;             // host: host_hash(value)
    };

    bool match_host(const at::Tensor& handle, const at::Tensor& plan) const {
        const uint64_t h = host_hash(handle);
        return std::any_of(entries_.rbegin(), entries_.rend(), [&](const Entry& e) {
            return e.handle.alive() && e.hash == h && e.value.sizes() == handle.sizes() && at::equal(e.value, handle) &&
                   e.plan_value.sizes() == plan.sizes() && at::equal(e.plan_value, plan);
        });
    }

    bool match_device(const at::Tensor& handle, const at::Tensor& plan, bool capturing, const char* op) const {
        for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
            if (!it->handle.is(handle)) continue;
            TORCH_CHECK_VALUE(it->version < 0 || tensor_version(handle) == it->version, "evenep.", op,
                              ": the handle was written in place after dispatch made it (version ", it->version,
                              " -> ", tensor_version(handle), ")");
            if (it->plan.is(plan)) return true;
            return !capturing && it->plan_value.sizes() == plan.sizes() && at::equal(it->plan_value, plan);
        }
        if (capturing) return false;
        return std::any_of(entries_.rbegin(), entries_.rend(), [&](const Entry& e) {
            return e.handle.alive() && e.value.sizes() == handle.sizes() && at::equal(e.value, handle) &&
                   e.plan_value.sizes() == plan.sizes() && at::equal(e.plan_value, plan);
        });
    }

    bool host_;
    std::vector<Entry> entries_;
};

}  // namespace evenep::python
