// Qwen3-Next stores its GDN input projections fused and interleaved per key-head group
// (transformers' Qwen3NextGatedDeltaNet.fix_query_key_value_ordering):
//   in_proj_qkvz rows, group g of nk:  [ q_g (dk) | k_g (dk) | v_{g*r..g*r+r-1} (r*dv) | z_{same} (r*dv) ]
//   in_proj_ba   rows, group g of nk:  [ b_{g*r..g*r+r-1} (r) | a_{same} (r) ]          with r = nv / nk.
// Qwen3.5 stores the same rows in plain head order: in_proj_qkv = [q (nk*dk) | k (nk*dk) | v (nv*dv)],
// in_proj_z, in_proj_b, in_proj_a. The loader permutes the fused rows into that order once (an owned
// copy: mapped checkpoint memory is read-only), so both models run one code path.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hanpu/tensor.hpp"

namespace hanpu::model {

/// For each row of the Qwen3.5 order [q | k | v | z] (2*nk*dk + 2*nv*dv rows), the row of the fused
/// in_proj_qkvz it comes from.
std::vector<int64_t> qwen3next_qkvz_source_rows(int64_t nk, int64_t nv, int64_t dk, int64_t dv);

/// For each row of the order [b (nv) | a (nv)], the row of the fused in_proj_ba it comes from.
std::vector<int64_t> qwen3next_ba_source_rows(int64_t nk, int64_t nv);

/// A copy of the rank-2 tensor `w` with its rows in the order `rows` (row i of the copy is row
/// rows[i] of w), same dtype, contiguous. Throws hanpu::Error naming `what` for a row out of range.
ByteBuffer gather_rows(const TensorView& w, std::span<const int64_t> rows, const std::string& what);

}  // namespace hanpu::model
