// Projections, activation scratch and weight helpers shared by the blocks (model_parts.hpp).
#include "model/model_parts.hpp"

#include <algorithm>
#include <cstring>

#include "model/layer_ops.hpp"

namespace hanpu::model {

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[static_cast<size_t>(i)] = static_cast<float>(load_as_double(v.data, v.dtype, i));
  return out;
}

Projection::Projection(const TensorView& w, const std::string& name, const ProjectionLoad& load)
    : out_(w.shape[0]), in_(w.shape[1]) {
  if (load.convert) {
    if (!load.convert->quantize)
      throw Error(name + ": weight format '" + load.convert->name + "' has no load-time quantizer");
    linear_ = load.convert->quantize(w, name, load.int8_group);
    return;
  }
  switch (w.dtype) {
    case DType::BF16: linear_ = std::make_unique<Bf16Linear>(w, name); break;
    case DType::F16: linear_ = std::make_unique<F16Linear>(w, name); break;  // stays f16 (the view is kept)
    // f32 (and f64) rows are copied, as before the registry: callers may hand a view of a buffer
    // they do not keep (the stacked rows of mixed parts below).
    default: linear_ = std::make_unique<F32Linear>(F32Linear::converted(w, name)); break;
  }
}

Projection::Projection(std::unique_ptr<Linear> linear)
    : out_(linear->out_features()), in_(linear->in_features()), linear_(std::move(linear)) {}

Projection::Projection(std::vector<Projection> parts) : in_(parts.empty() ? 0 : parts[0].in_features()) {
  for (const Projection& p : parts) {
    if (p.in_features() != in_) throw Error("Projection: stacked parts with different in_features");
    out_ += p.out_features();
  }
  parts_ = std::move(parts);
  int64_t col = 0;
  for (const Projection& p : parts_) {
    const auto* g = p.linear_ && p.parts_.empty() ? dynamic_cast<const GgufLinear*>(p.linear_.get()) : nullptr;
    if (!g) {
      gguf_parts_.clear();
      gguf_cols_.clear();
      break;
    }
    gguf_parts_.push_back(g);
    gguf_cols_.push_back(col);
    col += p.out_features();
  }
}

const Int8Linear* Projection::int8() const {
  return linear_ && linear_->format() == WeightFormat::kInt8 ? static_cast<const Int8Linear*>(linear_.get()) : nullptr;
}

void Projection::forward(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, EngineThreads threads, bool accumulate,
                         LinearPrecision precision) const {
  if (!parts_.empty()) {
    if (!gguf_parts_.empty() &&
        GgufLinear::forward_decode_parts(*threads.engine, gguf_parts_, gguf_cols_, x, ldx, y, ldy, M, threads.n, accumulate))
      return;
    int64_t col = 0;
    for (const Projection& p : parts_) {
      p.forward(x, ldx, y + col, ldy, M, threads, accumulate, precision);
      col += p.out_features();
    }
    return;
  }
  if (!linear_) throw Error("Projection: forward on an empty projection");
  linear_->forward(*threads.engine, x, ldx, y, ldy, M, threads.n, accumulate, precision);
}

float* scratch(Workspace& ws, ScratchSlot slot, int64_t floats) {
  const int at = static_cast<int>(kModelSlots) + static_cast<int>(slot);
  return ws.get<float>(at, static_cast<size_t>(std::max<int64_t>(floats, 1)));
}

Projection WeightReader::projection(const std::string& name, int64_t out, int64_t in, bool quantizable) const {
  if (get_blocks)
    if (const std::optional<BlockWeight> b = get_blocks(name, {out, in}, true))
      return Projection(std::make_unique<GgufLinear>(b->type, b->data, out, in, name, b->layout));
  if (get_stored && has(name + kInt8ScaleSuffix)) {
    const TensorView q = get_stored(name, {out, in});
    if (q.dtype != DType::I8)
      throw Error("tensor '" + name + "' has dtype " + dtype_name(q.dtype) + " next to its '" + name + kInt8ScaleSuffix +
                  "', expected I8 (a file `hanpu quantize` wrote)");
    if (load.int8_group <= 0)
      throw Error("tensor '" + name + "' is stored as int8, but no shard has the 'hanpu.int8_group' metadata "
                  "`hanpu quantize` writes");
    const int64_t group = load.int8_group;
    const TensorView s = get_stored(name + kInt8ScaleSuffix, {out, (in + group - 1) / group});
    if (s.dtype != DType::F32)
      throw Error("tensor '" + name + kInt8ScaleSuffix + "' has dtype " + dtype_name(s.dtype) + ", expected F32");
    return Projection(std::make_unique<Int8Linear>(static_cast<const int8_t*>(q.data), static_cast<const float*>(s.data),
                                                   out, in, group, name));
  }
  Projection p(get(name, {out, in}), name, quantizable ? load : ProjectionLoad{});
  if (quantizable && load.convert) {
    if (on_int8 && p.int8()) on_int8(name, *p.int8());
    if (release) release(name);  // converted at load: the copy is all the layer reads
  }
  return p;
}

Projection WeightReader::stacked(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t in) const {
  std::string name;
  for (const auto& [n, out] : parts) name += (name.empty() ? "" : " + ") + n;
  if (parts.size() == 1) return projection(parts[0].first, parts[0].second, in);
  int64_t rows = 0;
  for (const auto& [n, out] : parts) rows += out;
  if (get_blocks) {
    // GGUF: parts in GGML blocks stay where they are (each its own GgufLinear, possibly of
    // different types), side by side in one projection; float parts go through projection().
    std::vector<std::optional<BlockWeight>> blocks;
    for (const auto& [n, out] : parts) blocks.push_back(get_blocks(n, {out, in}, true));
    if (std::any_of(blocks.begin(), blocks.end(), [](const auto& b) { return b.has_value(); })) {
      std::vector<Projection> ps;
      for (size_t i = 0; i < parts.size(); ++i) {
        const auto& [n, out] = parts[i];
        if (blocks[i]) ps.emplace_back(std::make_unique<GgufLinear>(blocks[i]->type, blocks[i]->data, out, in, n, blocks[i]->layout));
        else ps.push_back(projection(n, out, in));
      }
      return Projection(std::move(ps));
    }
  }
  // Every part is copied below, so its source bytes are handed back as soon as they are (the
  // stacked rows are then the only copy a synthetic model or the process's resident set holds).
  auto release_parts = [&] {
    if (release)
      for (const auto& [n, out] : parts) release(n);
  };
  if (load.convert && load.convert->format == WeightFormat::kInt8) {
    // int8 weights (stored, or quantized at load per part and reported to on_int8 under the part's
    // own name). Quantization is per row, so the stacked layer is the parts' rows and scales one
    // after another.
    WeightReader each = *this;  // releases the parts once, below, after their rows are copied
    each.release = nullptr;
    std::vector<Projection> ps;
    for (const auto& [n, out] : parts) ps.push_back(each.projection(n, out, in));
    const int64_t group = ps[0].int8()->group(), groups = (in + group - 1) / group;
    for (const Projection& p : ps)
      if (p.int8()->group() != group) throw Error(name + ": parts quantized with different int8 groups");
    owned->push_back(ByteBuffer(static_cast<size_t>(rows * in)));
    auto* q = reinterpret_cast<int8_t*>(owned->back().data());
    owned->push_back(ByteBuffer(static_cast<size_t>(rows * groups) * sizeof(float)));
    auto* sc = reinterpret_cast<float*>(owned->back().data());
    for (const Projection& p : ps) {
      const int64_t r = p.out_features();
      std::memcpy(q, p.int8()->quantized(), static_cast<size_t>(r * in));
      std::memcpy(sc, p.int8()->scales(), static_cast<size_t>(r * groups) * sizeof(float));
      q += r * in;
      sc += r * groups;
    }
    release_parts();
    return Projection(std::make_unique<Int8Linear>(reinterpret_cast<const int8_t*>(owned->end()[-2].data()),
                                                   reinterpret_cast<const float*>(owned->back().data()), rows, in, group,
                                                   name));
  }
  if (load.convert) {
    // Another load-time conversion (f16): the parts converted one by one side by side. The
    // conversion is element-wise, so the stacked weight holds the same numbers as stacking first.
    std::vector<Projection> ps;
    for (const auto& [n, out] : parts) ps.push_back(projection(n, out, in));
    if (std::all_of(ps.begin(), ps.end(), [](const Projection& p) { return p.linear() && p.linear()->format() == WeightFormat::kF16; })) {
      // One stacked f16 weight (one GEMM, as bf16's), from the converted parts' rows.
      std::vector<TensorView> views;
      for (const Projection& p : ps)
        views.push_back(TensorView::contiguous(const_cast<uint16_t*>(static_cast<const F16Linear*>(p.linear())->data()),
                                               DType::F16, {p.out_features(), in}));
      return Projection(std::make_unique<F16Linear>(views, name));
    }
    return Projection(std::move(ps));
  }
  std::vector<TensorView> views;
  for (const auto& [n, out] : parts) views.push_back(get(n, {out, in}));
  if (std::all_of(views.begin(), views.end(), [](const TensorView& v) { return v.dtype == DType::BF16; })) {
    Projection p(std::make_unique<Bf16Linear>(views, name));  // copies the rows
    release_parts();
    return p;
  }
  if (std::all_of(views.begin(), views.end(), [](const TensorView& v) { return v.dtype == DType::F16; })) {
    Projection p(std::make_unique<F16Linear>(views, name));  // copies the rows, stays f16
    release_parts();
    return p;
  }
  // Mixed or non-bf16 parts (converted or test checkpoints): the rows as f32, one projection.
  ByteBuffer joined(static_cast<size_t>(rows * in) * sizeof(float));  // Projection keeps its own f32 copy
  auto* f = reinterpret_cast<float*>(joined.data());
  for (const TensorView& v : views)
    for (int64_t i = 0; i < v.numel(); ++i) *f++ = static_cast<float>(load_as_double(v.data, v.dtype, i));
  release_parts();
  return Projection(TensorView::contiguous(joined.data(), DType::F32, {rows, in}), name);
}

std::vector<float> WeightReader::norm_scale(const std::string& name, int64_t dim, bool plus_one) const {
  std::vector<float> v = floats(name, {dim});
  if (plus_one)
    for (float& x : v) x = 1.0f + x;
  return v;
}

ByteBuffer transpose_copy(const TensorView& w) {
  if (w.rank != 2) throw Error("transpose_copy: expected a rank-2 tensor, got " + w.shape_str());
  const int64_t rows = w.shape[0], cols = w.shape[1];
  const size_t es = dtype_size(w.dtype);
  ByteBuffer out(static_cast<size_t>(rows * cols) * es);
  const auto* src = static_cast<const std::byte*>(w.data);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(out.data() + static_cast<size_t>(c * rows + r) * es,
                  src + static_cast<size_t>(r * w.stride[0] + c * w.stride[1]) * es, es);
  return out;
}

}  // namespace hanpu::model
