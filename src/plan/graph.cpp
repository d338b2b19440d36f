// The operator graph of one chunk for GDN and KDA (the paper's chunkwise computation; FLA's fla/ops/gated_delta_rule and fla/ops/kda chunk kernels), in the three
// forms a plan may choose (WU, Inverse, GemmFirst), and the work each operator does on a chunk.
//
// The graph is fine-grained: every operator runs on one unit, so a matrix product and the vector
// work around it (gating, masks, row scales) are separate operators. paper_op maps each back to the
// six operators of the paper. Matrix operators write fp32 results (the L0C accumulator); vector
// operators write fp16 when their result feeds the matrix unit and fp32 otherwise.
#include <algorithm>
#include <array>
#include <iterator>
#include <optional>
#include <cmath>
#include <string>

#include "hanpu/plan.hpp"
#include "plan/lower.hpp"

namespace hanpu {

namespace {

// FLA's sub-chunk for the diagonal blocks of the triangular inverse (FLA's fla/ops/utils/solve_tril.py): the
// diagonal 16x16 blocks are inverted by forward substitution on the vector unit.
constexpr int64_t kSubChunk = 16;

struct GraphBuilder {
  OpGraph g;
  void tensor(const std::string& n, const std::string& r, const std::string& c, DType dt,
              TensorRole role = TensorRole::Intermediate) {
    g.tensors.push_back({n, r, c, dt, role});
  }
  // Name, paper operator and unit come from the operator's manifest row (hanpu/operators.hpp).
  void op(OpId id, std::vector<std::string> in, std::vector<std::string> out, bool row = false, int left = 1) {
    const OperatorManifestRow& r = operator_row(id);
    g.ops.push_back({id, std::string(r.name), std::string(r.paper_op), r.unit, std::move(in), std::move(out), row, left});
  }
};

}  // namespace

const std::vector<OpId>& kda_decay_operators() {
  static const std::vector<OpId> ops = [] {
    std::vector<OpId> v;
    for (const OperatorManifestRow& r : kOperatorManifest)
      if (is_decay_operator(r.id)) v.push_back(r.id);
    return v;
  }();
  return ops;
}

const char* graph_form_name(GraphForm f) {
  switch (f) {
    case GraphForm::WU: return "wu";
    case GraphForm::Inverse: return "inverse";
    case GraphForm::GemmFirst: return "gemm_first";
  }
  return "?";
}

const TensorDef& OpGraph::tensor(const std::string& name) const {
  for (const TensorDef& t : tensors)
    if (t.name == name) return t;
  throw Error("operator graph: no tensor \"" + name + "\"");
}

bool OpGraph::has_tensor(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const TensorDef& t) { return t.name == name; });
}

const OperatorDef& OpGraph::op(OpId id) const {
  for (const OperatorDef& o : ops)
    if (o.id == id) return o;
  throw Error("operator graph: no operator \"" + std::string(operator_name(id)) + "\"");
}

bool OpGraph::has_op(OpId id) const {
  return std::any_of(ops.begin(), ops.end(), [&](const OperatorDef& o) { return o.id == id; });
}


OpGraph make_op_graph(Variant variant, GraphForm form, bool in_place) {
  const bool channel = variant_traits(variant).channel_gate();  // the decay multiplies q and k element-wise
  GraphBuilder b;
  b.g.variant = variant;
  b.g.form = form;
  b.g.state_in_place = in_place;
  const DType f16 = DType::F16, f32 = DType::F32;
  const std::string s_out = in_place ? "S" : "S_next";

  // Inputs, output, state.
  b.tensor("q", "L", "K", f16, TensorRole::Input);
  b.tensor("k", "L", "K", f16, TensorRole::Input);
  b.tensor("v", "L", "V", f16, TensorRole::Input);
  b.tensor("g", "L", channel ? "K" : "1", f32, TensorRole::Input);
  b.tensor("beta", "L", "1", f32, TensorRole::Input);
  b.tensor("S", "K", "V", f32, TensorRole::State);
  if (!in_place) b.tensor("S_next", "K", "V", f32, TensorRole::State);
  b.tensor("o", "L", "V", f16, TensorRole::Output);

  // #1 gate: cumulative log-decay; KDA also forms the channel-decayed q and k the products use:
  // qe = q e^G, ke = k e^G, ki = k e^-G (anchored per sub-chunk in practice), kl = k e^(G_L - G).
  b.tensor("Gc", "L", channel ? "K" : "1", f32);
  std::string qm = "q", km = "k", kr = "k", kt = "k";  // operands of Q.., K.. (left), K^T (right), update
  if (channel) {
    for (const char* n : {"qe", "ke", "ki", "kl"}) b.tensor(n, "L", "K", f16);
    b.op(OpId::Gate, {"g"}, {"Gc"}, true);
    // Element-wise on L x K: the decayed operands are cheap to recompute in every kernel that
    // needs them, as FLA's kernels do, rather than stored. One operator per decayed operand, so
    // an order may build each just before its consumers (the reordering pass decides) and a
    // kernel builds only the operands it multiplies.
    b.op(OpId::DecayQ, {"q", "Gc"}, {"qe"}, false);
    b.op(OpId::DecayKe, {"k", "Gc"}, {"ke"}, false);
    b.op(OpId::DecayKi, {"k", "Gc"}, {"ki"}, false);
    b.op(OpId::DecayKl, {"k", "Gc"}, {"kl"}, false);
    qm = "qe", km = "ke", kr = "ki", kt = "kl";
  } else {
    b.op(OpId::Gate, {"g"}, {"Gc"}, true);
  }

  // #2 A = strictly-lower(diag(beta) K K^T gated); #6's Q K^T with the same operands.
  b.tensor("KK", "L", "L", f32);
  b.tensor("A", "L", "L", f32);
  b.tensor("QK", "L", "L", f32);
  b.tensor("P", "L", "L", f16);
  auto kkt = [&] {
    b.op(OpId::Kkt, {km, kr}, {"KK"});
    b.op(OpId::KktGate, channel ? std::vector<std::string>{"KK", "beta"} : std::vector<std::string>{"KK", "beta", "Gc"},
         {"A"}, true);
  };
  auto qkt = [&] { b.op(OpId::Qkt, {qm, kr}, {"QK"}); };
  auto qkt_gate = [&] {
    b.op(OpId::QktGate, channel ? std::vector<std::string>{"QK"} : std::vector<std::string>{"QK", "Gc"}, {"P"}, true);
  };
  b.tensor("Ad", "L", std::to_string(kSubChunk), f16);
  auto solve_diag = [&] { b.op(OpId::SolveDiag, {"A"}, {"Ad"}, true); };
  // The state half of #5 and the output #6, shared by all forms: `vnew` is v_new.
  b.tensor("QS", "L", "V", f32);
  b.tensor("PE", "L", "V", f32);
  b.tensor("KE", "K", "V", f32);
  auto qs = [&] { b.op(OpId::Qs, {qm, "S"}, {"QS"}); };
  auto output = [&](const std::string& vnew) {
    b.op(OpId::Pv, {"P", vnew}, {"PE"});
    b.op(OpId::Out, channel ? std::vector<std::string>{"QS", "PE"} : std::vector<std::string>{"QS", "Gc", "PE"}, {"o"}, !channel);
  };
  auto update = [&](const std::string& vnew) {
    if (!channel) {
      b.tensor("Eg", "L", "V", f16);
      b.op(OpId::UpdateGate, {vnew, "Gc"}, {"Eg"}, true);
      b.op(OpId::Update, {kt, "Eg"}, {"KE"});
    } else {
      b.op(OpId::Update, {kt, vnew}, {"KE"});
    }
    b.op(OpId::StateAdd, {"S", "Gc", "KE"}, {s_out}, channel);
  };
  auto rhs = [&] {
    b.tensor("KS", "L", "V", f32);
    b.tensor("X", "L", "V", f32);
    b.op(OpId::Ks, {km, "S"}, {"KS"});
  };
  auto rhs_vec = [&] {
    b.op(OpId::Rhs, channel ? std::vector<std::string>{"v", "beta", "KS"} : std::vector<std::string>{"v", "beta", "Gc", "KS"},
         {"X"}, true);
  };

  switch (form) {
    case GraphForm::GemmFirst: {
      // Shared-input GEMMs first (K K^T, Q K^T, K S, Q S), then the vector work, then the solve.
      b.tensor("E", "L", "V", f32);
      kkt();
      b.g.ops.pop_back();  // kkt_gate goes after the GEMM group
      qkt();
      rhs();
      qs();
      b.op(OpId::KktGate, channel ? std::vector<std::string>{"KK", "beta"} : std::vector<std::string>{"KK", "beta", "Gc"},
           {"A"}, true);
      qkt_gate();
      rhs_vec();
      solve_diag();
      b.op(OpId::Solve, {"Ad", "A", "X"}, {"E"}, false, 2);
      output("E");
      update("E");
      break;
    }
    case GraphForm::Inverse: {
      b.tensor("Tm", "L", "L", f32);
      b.tensor("E", "L", "V", f32);
      kkt();
      solve_diag();
      b.op(OpId::SolveInv, {"Ad", "A"}, {"Tm"});
      rhs();
      qs();
      qkt();
      qkt_gate();
      rhs_vec();
      b.op(OpId::Apply, {"Tm", "X"}, {"E"});
      output("E");
      update("E");
      break;
    }
    case GraphForm::WU: {
      for (const char* n : {"Tm", "W", "U", "WS"}) b.tensor(n, "L", std::string(n) == "W" ? "K" : (std::string(n) == "Tm" ? "L" : "V"), f32);
      b.tensor("kb", "L", "K", f16);
      b.tensor("vb", "L", "V", f16);
      b.tensor("vn", "L", "V", f16);
      kkt();
      solve_diag();
      b.op(OpId::SolveInv, {"Ad", "A"}, {"Tm"});
      b.op(OpId::WuScale, channel ? std::vector<std::string>{"ke", "v", "beta"} : std::vector<std::string>{"k", "v", "beta", "Gc"},
           {"kb", "vb"}, true);
      b.op(OpId::Wu, {"Tm", "kb", "vb"}, {"W", "U"});
      b.op(OpId::Ws, {"W", "S"}, {"WS"});
      b.op(OpId::Vnew, {"U", "WS"}, {"vn"});
      if (in_place) {
        // Chunk-first: the output reads S before the update overwrites it.
        qkt();
        qkt_gate();
        qs();
        output("vn");
        update("vn");
      } else {
        // FLA's order: the next state is built first, the output afterwards (two states live).
        update("vn");
        qkt();
        qkt_gate();
        qs();
        output("vn");
      }
      break;
    }
  }
  return b.g;
}

namespace {

int64_t dim_value(const std::string& d, int64_t L, int64_t K, int64_t Vc) {
  if (d == "L") return L;
  if (d == "K") return K;
  if (d == "V") return Vc;
  return std::stoll(d);
}

}  // namespace

int64_t tensor_bytes(const TensorDef& t, int64_t L, int64_t K, int64_t Vc) {
  return dim_value(t.rows, L, K, Vc) * dim_value(t.cols, L, K, Vc) * static_cast<int64_t>(dtype_size(t.dtype));
}

OpCounts op_counts(const OpGraph& g, const OperatorDef& op, int64_t L, int64_t K, int64_t Vc, int64_t tile,
                   bool masked_full_tiles) {
  const bool channel = variant_traits(g.variant).channel_gate();
  const double l = static_cast<double>(L), k = static_cast<double>(K), v = static_cast<double>(Vc);
  const double t = static_cast<double>(tile);
  auto up = [&](double x) { return std::ceil(x / t) * t; };
  const double nb = std::ceil(l / t);
  // The L x L operand a triangular product executes: the lower block triangle incl. the diagonal,
  // or the whole padded tile when the kernel multiplies full tiles and masks afterwards.
  const double tri_blocks = masked_full_tiles ? nb * nb * t * t : nb * (nb + 1) / 2 * t * t;
  const double strict = l * (l - 1) / 2, incl = l * (l + 1) / 2;
  OpCounts c;
  switch (op.id) {
    case OpId::Gate:
      c.vector_ops = channel ? 2 * l * k : 2 * l;  // cumsum and the exponent (per channel for KDA)
      break;
    case OpId::DecayQ:
      c.vector_ops = 2 * l * k;  // the exponential e^G and the product
      break;
    case OpId::DecayKe:
      c.vector_ops = l * k;  // the product with e^G (its exponential is counted once, in decay_q)
      break;
    case OpId::DecayKi:
    case OpId::DecayKl:
      c.vector_ops = 2 * l * k;  // an exponential (e^-G; e^(G_L - G)) and the product
      break;
    case OpId::Kkt:
      c.macs = strict * k, c.executed_macs = tri_blocks * up(k);
      break;
    case OpId::KktGate:
      c.vector_ops = (channel ? 2 : 3) * l * l;  // (exp of decay difference,) beta row scale, mask
      break;
    case OpId::Qkt:
      c.macs = incl * k, c.executed_macs = tri_blocks * up(k);
      break;
    case OpId::QktGate:
      c.vector_ops = (channel ? 1 : 2) * l * l;
      break;
    case OpId::Ks:
    case OpId::Qs:
    case OpId::Ws:
      c.macs = l * k * v, c.executed_macs = up(l) * up(k) * up(v);
      break;
    case OpId::Rhs:
      c.vector_ops = 3 * l * v;  // beta v, row scale of K S, subtraction
      break;
    case OpId::SolveDiag: {
      const double sub = static_cast<double>(kSubChunk);
      c.vector_ops = std::ceil(l / sub) * sub * sub * sub / 3;  // forward substitution per 16x16 block
      break;
    }
    case OpId::Solve:
      c.macs = strict * v, c.executed_macs = tri_blocks * up(v);
      c.vector_ops = nb * l * v / 2;  // subtracting each block row's accumulated products
      break;
    case OpId::SolveInv: {
      c.macs = l * (l - 1) * (l - 2) / 6;
      double blocks = 0;  // block merge: Ai_rc = -Ai_rr (sum_{m=c}^{r-1} A_rm Ai_mc): d+1 products at distance d
      for (double d = 1; d < nb; ++d) blocks += (nb - d) * (d + 1);
      c.executed_macs = blocks * t * t * t;
      break;
    }
    case OpId::WuScale:
      c.vector_ops = (channel ? 1 : 2) * l * k + l * v;
      break;
    case OpId::Wu:
      c.macs = incl * (k + v), c.executed_macs = tri_blocks * (up(k) + up(v));
      break;
    case OpId::Vnew:
      c.vector_ops = l * v;
      break;
    case OpId::Apply:
    case OpId::Pv:
      c.macs = incl * v, c.executed_macs = tri_blocks * up(v);
      break;
    case OpId::Out:
      c.vector_ops = (channel ? 2 : 3) * l * v;
      break;
    case OpId::UpdateGate:
      c.vector_ops = 2 * l * v;
      break;
    case OpId::Update:
      c.macs = k * l * v, c.executed_macs = up(k) * up(l) * up(v);
      break;
    case OpId::StateAdd:
      c.vector_ops = 2 * k * v;
      break;
  }
  return c;
}

const OpGraph& op_graph(Variant variant, GraphForm form, bool state_in_place) {
  // Every (variant, form, state handling), built on first use (thread-safe static init) and
  // never changed afterwards.
  static const std::vector<OpGraph> graphs = [] {
    std::vector<OpGraph> all;
    for (size_t v = 0; v < std::size(kVariantTraits); ++v)
      for (GraphForm f : kGraphForms)
        for (bool in_place : {false, true}) all.push_back(make_op_graph(static_cast<Variant>(v), f, in_place));
    return all;
  }();
  const size_t v = static_cast<size_t>(variant);
  if (v >= std::size(kVariantTraits)) throw Error("operator graph: unknown variant " + std::to_string(v));
  static_assert(static_cast<size_t>(kGraphForms[0]) == 0 && static_cast<size_t>(kGraphForms[1]) == 1 && static_cast<size_t>(kGraphForms[2]) == 2,
                "op_graph indexes its graphs by the form's value");
  return graphs[(v * kGraphForms.size() + static_cast<size_t>(form)) * 2 + (state_in_place ? 1 : 0)];
}

double layer_macs(const Problem& p, GraphForm form) {
  const OpGraph& g = op_graph(p.variant, form, true);
  double total = 0;
  for (int64_t s = 0; s < p.sequences(); ++s) {
    const int64_t nc = p.chunks_of(s);
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t L = p.chunk_len(s, c);
      for (const OperatorDef& op : g.ops) total += op_counts(g, op, L, p.K, p.V, 16).macs;
    }
  }
  return total * static_cast<double>(p.HV);
}

// ---------------------------------------------------------------------------------------------

int64_t Problem::total_tokens() const {
  int64_t n = 0;
  for (int64_t l : seqlens) n += l;
  return n;
}

int64_t Problem::chunks_of(int64_t seq) const {
  return (seqlens.at(static_cast<size_t>(seq)) + chunk - 1) / chunk;
}

int64_t Problem::total_chunks() const {
  int64_t n = 0;
  for (int64_t s = 0; s < sequences(); ++s) n += chunks_of(s);
  return n;
}

int64_t Problem::chunk_len(int64_t seq, int64_t c) const {
  const int64_t len = seqlens.at(static_cast<size_t>(seq));
  return std::min(chunk, len - c * chunk);
}

void validate_problem(const Problem& p) {
  auto bad = [](const std::string& field, const std::string& got, const std::string& want) {
    throw Error("problem." + field + ": got " + got + ", expected " + want);
  };
  // Limits first (include/hanpu/plan.hpp, docs/RELIABILITY.md), and sums without overflow.
  const std::string limit = " (hanpu's limit, docs/RELIABILITY.md)";
  if (p.seqlens.empty()) bad("seqlens", "an empty list", "at least one sequence");
  if (p.sequences() > kMaxSequences)
    bad("seqlens", std::to_string(p.sequences()) + " sequences", "at most " + std::to_string(kMaxSequences) + limit);
  int64_t tokens = 0;
  for (size_t i = 0; i < p.seqlens.size(); ++i) {
    if (p.seqlens[i] < 0) bad("seqlens[" + std::to_string(i) + "]", std::to_string(p.seqlens[i]), "a length >= 0");
    if (p.seqlens[i] > kMaxTokens || (tokens += p.seqlens[i]) > kMaxTokens)
      bad(p.seqlens.size() == 1 ? "seqlens[0] (T)" : "seqlens", p.seqlens.size() == 1 ? std::to_string(p.seqlens[0]) : "more tokens",
          "at most " + std::to_string(kMaxTokens) + " tokens in total" + limit);
  }
  if (tokens <= 0) bad("seqlens", "no tokens", "at least one token");
  if (p.H < 1 || p.H > kMaxHeads) bad("H", std::to_string(p.H), "1.." + std::to_string(kMaxHeads) + limit);
  if (p.HV < 1 || p.HV > kMaxHeads || p.HV % p.H != 0)
    bad("HV", std::to_string(p.HV), "a positive multiple of H = " + std::to_string(p.H) + ", at most " + std::to_string(kMaxHeads));
  if (p.K < 1 || p.K > kMaxHeadDim) bad("K", std::to_string(p.K), "1.." + std::to_string(kMaxHeadDim) + limit);
  if (p.V < 1 || p.V > kMaxHeadDim) bad("V", std::to_string(p.V), "1.." + std::to_string(kMaxHeadDim) + limit);
  if (p.chunk < 16 || p.chunk % 16 != 0 || p.chunk > kMaxHeadDim)
    bad("chunk", std::to_string(p.chunk), "a positive multiple of 16 (the substitution block), at most " + std::to_string(kMaxHeadDim));
  if (p.HV * p.total_chunks() > kMaxHeadChunks)
    bad("HV x chunks", std::to_string(p.HV) + " x " + std::to_string(p.total_chunks()),
        "at most " + std::to_string(kMaxHeadChunks) + " (value heads x chunks of all sequences)" + limit);
}

Layout working_layout(const OperatorDef& op, const OpGraph& g, const std::map<std::string, Layout>& layouts) {
  if (op.outputs.empty()) return Layout::Dense;
  const TensorDef& t = g.tensor(op.outputs.front());
  if (!plan_detail::is_layout_decision(t)) return Layout::Dense;
  auto it = layouts.find(t.name == "S_next" ? "S" : t.name);
  return it == layouts.end() ? Layout::Dense : it->second;
}

}  // namespace hanpu
