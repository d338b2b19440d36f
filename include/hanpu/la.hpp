// Linear-attention operators: Gated DeltaNet (GDN) and Kimi Delta Attention (KDA), prefill and
// decode, with FLA's argument conventions (fla/ops/gated_delta_rule/chunk.py, fla/ops/kda/chunk.py; docs/PYTHON.md).
//
//   q, k  [B,T,H,K]      v [B,T,HV,V]      g [B,T,HV] (GDN) or [B,T,HV,K] (KDA)      beta [B,T,HV]
//   initial_state [N,HV,K,V] fp32 (optional)       cu_seqlens [N+1] int32/int64 (optional, then B = 1)
//   -> o [B,T,HV,V] (dtype of v),  final_state [N,HV,K,V] fp32
//
// Value head hv reads key head hv / (HV/H). q is multiplied by `scale` (default K^-0.5). Each token
// first decays the state, then applies the delta-rule error, and its output reads the updated state.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "hanpu/la_variant.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu {

const char* variant_name(Variant v);  // VariantTraits::name: "gdn" / "kda"
std::optional<Variant> variant_from_name(const std::string& name);  // inverse; nullopt otherwise
/// The names of all variants, for messages: variant_names(" or ") is "gdn or kda".
std::string variant_names(const std::string& last_sep, const std::string& sep = ", ");

/// Input transforms FLA can apply inside its kernels (fla/ops/gated_delta_rule/gate.py,
/// fla/ops/kda/gate.py, fla/modules/l2norm.py, fla/ops/common/gate.py).
struct LaOptions {
  std::optional<float> scale;   // default K^-0.5
  bool qk_l2norm = false;       // q,k <- x / sqrt(sum x^2 + 1e-6), fp32
  bool gate_in_kernel = false;  // g is the raw pre-activation; needs A_log (and dt_bias if given)
  /// KDA with gate_in_kernel only: the lower-bounded ("safe") gate of FLA's fla/ops/kda/gate.py,
  /// g = lower_bound * sigmoid(exp(A_log) * (raw + dt_bias)), in (lower_bound, 0); A_log may then
  /// be absent (rate 1: lower_bound * sigmoid(raw + dt_bias)). Must be finite and negative.
  /// (FLA's safe_gate flag only picks its kernel for bounded gates; hanpu's kernels are exact for
  /// every gate, so it has no counterpart here.)
  std::optional<float> lower_bound;
  bool beta_sigmoid = false;    // beta <- sigmoid(beta)
  bool allow_neg_eigval = false;  // with beta_sigmoid: beta <- 2 sigmoid(beta), in [0,2)
};

struct LaInputs {
  TensorView q, k, v, g, beta;
  TensorView initial_state;  // empty() when absent: zero state
  TensorView cu_seqlens;     // empty() when absent: B independent sequences of length T
  TensorView A_log;          // [HV], used with gate_in_kernel
  TensorView dt_bias;        // GDN [HV], KDA [HV*K]; optional with gate_in_kernel
};

struct LaOutputs {
  TensorView o;            // [B,T,HV,V], any float dtype (normally v's)
  TensorView final_state;  // [N,HV,K,V] fp32; may be empty() when not wanted
};

/// Which execution of the same computation the CPU backend runs. All give the same result up to
/// fp32 rounding; they differ in speed and memory (docs/PERFORMANCE.md).
enum class CpuPath {
  HeadFused,  // HA-NPU: (sequence, value head, column block) items, all operators fused per core
  FlaChunk,   // FLA-style baseline: chunk-parallel Map phases, intermediates in main memory
  Recurrent,  // the token-by-token recurrence (also the decode path)
};
const char* cpu_path_name(CpuPath p);  // "hanpu" / "fla" / "recurrent"
std::optional<CpuPath> cpu_path_from_name(const std::string& name);  // inverse; nullopt otherwise

struct Plan;         // hanpu/plan.hpp
struct CpuSchedule;  // hanpu/plan_exec.hpp
class Engine;        // hanpu/engine.hpp

/// What a call ran (ExecOptions::report): the plan, whether the plan cache had it, and the cost
/// of getting it.
struct ExecReport {
  std::shared_ptr<const Plan> plan;  // null when there was nothing to plan (no tokens at all)
  std::shared_ptr<const CpuSchedule> schedule;
  bool plan_cache_hit = false;  // false also when the caller passed the plan
  double planning_seconds = 0;  // plan look-up (and on a miss planning) plus lowering
  /// What ran the head-fused engine's GEMMs: "f32", "amx-round", "amx-split" (ExecOptions::amx),
  /// or "f32 (amx: ...)" naming why a requested AMX setting did not run.
  std::string gemms;
};

/// The head-fused GDN and KDA engines' GEMMs on Intel AMX (ExecOptions::amx). The f32 operands of
/// the products (the state S, v_new, the masked gram P; KDA's decayed q and k rows) become bf16:
enum class LaAmx {
  Off,    // the f32 FMA engine (the default)
  Round,  // rounded to bf16 (relative error <= 2^-8 each, as FLA does on GPU tensor cores)
  Split,  // split into two bf16 terms hi + lo (<= 2^-16 each; two or three tile products)
};
const char* la_amx_name(LaAmx a);                            // "off" / "round" / "split"
std::optional<LaAmx> la_amx_from_name(const std::string& name);  // inverse; nullopt otherwise

struct ExecOptions {
  /// Which strategy to plan when `plan` is null: HeadFused plans "hanpu", FlaChunk plans "fla",
  /// Recurrent runs the "hanpu" plan's mapping token by token. With a `plan`, the plan decides:
  /// the path must be left at HeadFused (or be the one the plan lowers to).
  CpuPath path = CpuPath::HeadFused;
  int threads = 0;             // 0: all hardware threads (with a plan: 0 or the plan's cores)
  const Plan* plan = nullptr;  // a planner Plan to run; planned for the host (plan cache) if null
  /// If set, receives the bytes of working memory the call allocated beyond its inputs and
  /// outputs (per-thread arenas, and for the FLA-style path its main-memory intermediates).
  size_t* workspace_bytes = nullptr;
  /// Head-fused GDN with bf16 q and k: form K K^T and Q K^T with the CPU's bf16 dot-product
  /// instructions (AVX512-BF16) when it has them. Both factors are the caller's bf16 values and
  /// their products are exact in f32, so only the summation order changes (docs/PERFORMANCE.md).
  /// false: always convert to f32 first (for comparison).
  bool bf16_dot = true;
  /// Head-fused GDN or KDA with bf16 q and k, GEMM-first program, on a CPU with usable AMX (tiles and
  /// the OS permission): the products K S, Q S, P v_new and the state update K^T v_new on AMX
  /// tiles, the state and every accumulator in f32 (docs/ACCURACY.md has the bound each setting
  /// adds). Anywhere else the f32 engine runs, as with Off. GDN needs bf16_dot (the staged bf16
  /// rows); KDA (bf16 q and k) runs its four products on the decayed f32 operands, grams in f32.
  LaAmx amx = LaAmx::Off;
  /// If set, receives the plan the call ran and the planning cost.
  ExecReport* report = nullptr;
  /// The engine whose pool and workspaces the call runs on; null: Engine::default_engine().
  /// threads = 0 then means the engine's threads.
  Engine* engine = nullptr;
};

/// Shapes after validation; produced by validate_la (throws hanpu::Error naming the tensor).
struct LaShape {
  Variant variant = Variant::GDN;
  int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0;
  int64_t N = 0;  // number of sequences
  bool varlen = false;
};
LaShape validate_la(Variant variant, const LaInputs& in, const LaOptions& opt);
/// Also checks outputs against the validated shape.
void validate_la_outputs(const LaShape& s, const LaOutputs& out);

/// Prefill: the whole sequence(s); writes o and final_state.
void gdn_prefill(const LaInputs& in, const LaOptions& opt, const LaOutputs& out, const ExecOptions& ex = {});
void kda_prefill(const LaInputs& in, const LaOptions& opt, const LaOutputs& out, const ExecOptions& ex = {});
void la_prefill(Variant variant, const LaInputs& in, const LaOptions& opt, const LaOutputs& out,
                const ExecOptions& ex = {});

/// Decode: the recurrent step for each of the T (usually 1) new tokens, updating `state`
/// [N,HV,K,V] fp32 in place (the same layout prefill returns as final_state). in.initial_state
/// is ignored; o receives the new tokens' outputs.
void gdn_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, int threads = 0);
void kda_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, int threads = 0);
/// The same on ex.engine with ex.threads (ex.path and ex.plan must be left at their defaults:
/// decode runs the recurrence of the cached "hanpu" plan's mapping).
void gdn_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, const ExecOptions& ex);
void kda_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, const ExecOptions& ex);

/// Convenience: allocate outputs (o in v's dtype, final_state fp32) and run prefill.
struct LaResult {
  Tensor o, final_state;
};
LaResult la_prefill_alloc(Variant variant, const LaInputs& in, const LaOptions& opt, const ExecOptions& ex = {});

/// Operation count used by the benchmarks (docs/PERFORMANCE.md): multiply-adds of the GEMM-first
/// chunked algorithm with exact triangles, times 2, for one token of one value head, chunk C.
double la_flops_per_token_head(Variant variant, int64_t K, int64_t V, int64_t C = 64);

}  // namespace hanpu
