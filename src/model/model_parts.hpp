// The pieces every block of a hybrid model is built from: projections over weights in any format
// (hanpu::Linear), the per-thread activation scratch, the weight reader the loader hands to each block,
// and timing. Internal to src/model.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hanpu/engine_work.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/weight_format.hpp"
#include "model/gguf_arch.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu::model {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A tensor's values as F32 (any float dtype).
std::vector<float> to_f32(const TensorView& v);

/// What the loader does with a checkpoint's float projections: keep them as stored (`convert`
/// null: BF16 -> Bf16Linear, F16 -> F16Linear, F32 -> F32Linear), or convert each with the load-time
/// quantizer of a registry row (hanpu/weight_format.hpp: int8, f16).
struct ProjectionLoad {
  const WeightFormatInfo* convert = nullptr;
  /// int8's inputs per scale (the quantizer's argument; a stored int8 file's group).
  int64_t int8_group = 0;
  /// Whether converting commutes with transposing a weight (an element-wise conversion: f16; not
  /// int8's groups along in_features), so that W and a transposed copy hold the same numbers.
  bool elementwise() const { return convert == nullptr || convert->block_elems == 1; }
};

/// y = x W^T over a weight in any format (hanpu::Linear), or several of them side by side.
class Projection {
 public:
  Projection() = default;
  /// A checked weight view as a projection in the format `load` says (the view must stay valid
  /// when kept as stored; converted weights are copies).
  Projection(const TensorView& w, const std::string& name, const ProjectionLoad& load = {});
  explicit Projection(std::unique_ptr<Linear> linear);
  /// Several projections of one input side by side: output columns in the order given (stacked
  /// parts that cannot share one weight, e.g. a Q4_K_M file's Q4_K q/k rows next to Q6_K v rows).
  explicit Projection(std::vector<Projection> parts);
  /// The single weight (null for side-by-side parts or an empty projection).
  const Linear* linear() const { return linear_.get(); }
  /// The weight as int8 (its format is WeightFormat::kInt8), else null.
  const Int8Linear* int8() const;
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  /// y[m, :out] (+)= x[m, :in] W^T for m < M; rows of x and y are ldx / ldy floats apart.
  void forward(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, EngineThreads threads, bool accumulate,
               LinearPrecision precision = LinearPrecision::kExact) const;

 private:
  int64_t out_ = 0, in_ = 0;
  std::unique_ptr<Linear> linear_;
  std::vector<Projection> parts_;
  // Where every part is a GGUF weight (a GgufLinear of its own): the parts and their first output
  // columns, for GgufLinear::forward_decode_parts (one activation quantization and one pass of the
  // pool per decode row for all of them).
  std::vector<const GgufLinear*> gguf_parts_;
  std::vector<int64_t> gguf_cols_;
};

/// Activation buffers reused across forward() calls, in the workspace the forward holds from its
/// model's engine for the call (hanpu/engine_work.hpp: two forwards at once hold two): a prefill of 2K tokens needs
/// ~150 MiB of activations per layer, and fresh allocations would page-fault (and zero) all of it
/// for every layer. Each slot only grows. They are ByteBuffers, not vectors: 64-byte aligned rows and,
/// from 2 MiB on, huge pages. The LA engine reads q/k/v as 512-byte pieces of rows 24 KiB apart (one
/// per token and head); from malloc'd memory every piece straddled a cache line and every row cost a
/// TLB miss, which made the engine ~2.5x slower here than on the same views standalone.
enum ScratchSlot {
  kX, kH, kGateUp, kMixed, kA, kConv, kO, kQG, kQ, kAttn,
  kRouter, kExpertIn, kExpertGateUp, kExpertOut, kSharedGateUp, kSharedScore,
  kLowRank, kGateOut, kLatentQ, kLatentOut, kExpandedQ, kExpandedKeys, kExpandedValues,
  kSlots
};
float* scratch(Workspace& ws, ScratchSlot slot, int64_t floats);
static_assert(static_cast<int>(kModelSlots) + static_cast<int>(kSlots) <= static_cast<int>(kWorkspaceSlots),
              "hanpu/engine_work.hpp: more model slots");

/// What the loader gives each block: checked tensors by name and expected shape (a missing tensor
/// or a wrong shape throws, naming the file and tensor), whether a tensor exists, and a place to
/// keep weight copies a block makes at load (permuted or transposed rows).
struct WeightReader {
  std::function<TensorView(const std::string& name, const std::vector<int64_t>& shape)> get;
  std::function<bool(const std::string& name)> has;
  std::vector<ByteBuffer>* owned = nullptr;
  /// The projections' format at load (ModelLoadOptions::weights; a file `hanpu quantize` wrote
  /// gives its int8 group in its hanpu.int8_group metadata).
  ProjectionLoad load;
  /// Checkpoints only: a tensor with its shape checked and any dtype (stored int8 weights).
  std::function<TensorView(const std::string& name, const std::vector<int64_t>& shape)> get_stored;
  /// ModelLoadOptions::on_int8_projection.
  std::function<void(const std::string& name, const Int8Linear& q)> on_int8;
  /// Optional: the loader will not read tensor `name` again (stacked() copied it, or projection()
  /// quantized it to int8 at load). A synthetic model frees its bytes; a mapped checkpoint drops
  /// its pages from the process.
  std::function<void(const std::string& name)> release;
  /// GGUF checkpoints: the projection `name` [out, in] as GGML blocks when the file stores it
  /// quantized (projection() then keeps it in blocks: GgufLinear); nullopt: read it with get().
  /// row_lanes_ok: as GgufCheckpoint::get_blocks (true where only GgufLinear reads the blocks).
  std::function<std::optional<BlockWeight>(const std::string& name, const std::vector<int64_t>& shape, bool row_lanes_ok)>
      get_blocks;

  /// A checked weight as a projection; `quantizable` false keeps it as stored even with int8
  /// weights (MoE routers and shared-expert gates: tiny, and they decide which experts run).
  /// A weight stored as int8 with its `<name>.int8_scale` (hanpu quantize) is used as it is.
  Projection projection(const std::string& name, int64_t out, int64_t in, bool quantizable = true) const;
  /// Several projections of one input stacked along their outputs into one (one GEMM instead of
  /// several; output columns in the order given). Each part is read as projection() reads it
  /// (stored int8 used as it is, quantized at load otherwise, reported to on_int8 under its own
  /// name); the stacked rows are a copy, after which each part is handed to `release`. One part:
  /// projection(). `parts`: (tensor name, out_features); all have `in` inputs.
  Projection stacked(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t in) const;
  /// A projection over a view the block made (permuted or sliced rows), with this reader's format.
  Projection projection_of(const TensorView& w, const std::string& name) const { return Projection(w, name, load); }
  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) const {
    return to_f32(get(name, shape));
  }
  /// An RMSNorm weight as the multiplier the kernels take: 1 + w for Qwen's zero-centred norms.
  std::vector<float> norm_scale(const std::string& name, int64_t dim, bool plus_one) const;
};

/// The suffix of a stored int8 weight's scale tensor: `<name>.int8_scale` [out, ceil(in / group)] F32.
inline constexpr const char* kInt8ScaleSuffix = ".int8_scale";

/// A copy of the rank-2 tensor `w` ([rows, cols]) transposed to [cols, rows], same dtype.
ByteBuffer transpose_copy(const TensorView& w);

}  // namespace hanpu::model
