// Lowering a kernel's operator order to its chunk program (moves along the device's paths, casts,
// layout transforms, computes), the lifetimes of every on-core tensor copy, the peak live bytes
// per buffer, and the spill/capacity pass. Internal to the planner.
#pragma once

#include <map>
#include <set>
#include <string>

#include "hanpu/device.hpp"
#include "hanpu/plan.hpp"

namespace hanpu::plan_detail {

struct LowerContext {
  const OpGraph* graph = nullptr;
  const Device* device = nullptr;
  std::set<std::string> from_gm;  // tensors this kernel reads from GM (graph inputs, earlier kernels' results)
  std::set<std::string> to_gm;    // tensors it stores to GM (outputs, later kernels' inputs)
  std::set<std::string> f16_in_gm;  // fp32 tensors kept in GM as fp16 (only matrix consumers later)
  std::map<std::string, Layout> layouts;
  int64_t K = 128;  // key head dim of the problem
};

/// Fills k.steps, k.lifetimes, k.peak_bytes, k.peak_tensors for a chunk of L tokens and Vc columns
/// (k.order, k.parallel, k.state_in/out, k.buffering, k.spilled must be set).
void lower_kernel(Kernel& k, const LowerContext& cx, int64_t L, int64_t Vc);

/// Lowers with double buffering if it fits, else single; if a buffer still overflows, spills
/// (allow_spill) the largest long-lived tensor not in use at the peak and retries, or throws a
/// hanpu::Error naming the buffer, capacity and the tensors live at the peak.
void lower_with_capacity(Kernel& k, const LowerContext& cx, int64_t L, int64_t Vc, bool allow_spill,
                         const std::string& strategy);

/// Whether a tensor's layout is a planning decision (on-core 2-D intermediates and the state).
bool is_layout_decision(const TensorDef& t);
/// A 2-D GM input that `vector_readers` vector operators of an order read, more than one: its UB
/// copy's layout is planned too (converted once on arrival when blocked), so the readers share one
/// conversion.
bool is_shared_input(const TensorDef& t, int vector_readers);

}  // namespace hanpu::plan_detail
