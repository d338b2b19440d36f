// Lowering an operator order to a chunk program on a device (see lower.hpp).
//
// Data movement follows the device's paths, found by a cheapest-route search (cost = 1/bandwidth
// per hop), so the same code emits UB->L1 on a 310P and a GM round trip where a device lacks that
// path. Rules of the model (docs/SIMULATION.md):
//  * the matrix unit reads fp16 blocked operands from its operand buffers (L0A left, L0B right)
//    and writes fp32 blocked results to its output buffer (L0C), from where they move to the vector
//    unit's buffer (UB) at once, or, in a kernel with results_wait (the reordering pass's), when
//    their first consumer needs them;
//  * matrix operands are staged in the buffer that feeds both operand buffers (L1) and stay there
//    until their last use in the chunk; operand buffers keep operands (least recently used
//    evicted) only across GEMMs adjacent in the order, so back-to-back GEMMs sharing an operand
//    load it once; a vector operator in between, or the inversion's workspace, releases them;
//  * a double-buffered input's second slot is live for the whole chunk, and buffers the device
//    reserves (reserved_bytes) for the whole kernel;
//  * GM holds dense data; DMA to and from GM converts layouts on the fly (ND2NZ), so GM inputs
//    need no transform; every other dense<->blocked conversion is a transform on the vector unit;
//  * an fp32 tensor bound for the matrix unit is cast to fp16 in UB first.
#include "plan/lower.hpp"

#include <algorithm>
#include <limits>
#include <queue>
#include <sstream>

namespace hanpu::plan_detail {

namespace {

constexpr const char* kGM = "GM";

struct Copy {
  int ready = -1;     // step that made the copy available (-1: at chunk start)
  int first = -1;     // step it arrived at (for lifetimes)
  int last_use = -1;  // last step that read it
  int elem = 0;       // bytes per element as stored
  Layout layout = Layout::Dense;
  bool from_gm = false;  // loaded from GM (double-buffered when the kernel prefetches)
  bool carried = false;  // lives across chunks (the state)
  int touch = 0;      // LRU clock for operand buffers
};

struct Route {
  std::vector<const PathSpec*> hops;
  double cost = std::numeric_limits<double>::infinity();
};

Route cheapest_route(const Device& dev, const std::string& from, const std::string& to) {
  // Dijkstra over the path graph; a handful of nodes.
  std::map<std::string, double> dist;
  std::map<std::string, const PathSpec*> via;
  using Item = std::pair<double, std::string>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> pq;
  dist[from] = 0;
  pq.push({0, from});
  while (!pq.empty()) {
    auto [d, n] = pq.top();
    pq.pop();
    if (d > dist[n]) continue;
    if (n == to) break;
    for (const PathSpec& p : dev.paths) {
      if (p.from != n || p.bandwidth_gbs.value <= 0) continue;
      const double nd = d + 1.0 / p.bandwidth_gbs.value;
      auto it = dist.find(p.to);
      if (it == dist.end() || nd < it->second) {
        dist[p.to] = nd;
        via[p.to] = &p;
        pq.push({nd, p.to});
      }
    }
  }
  Route r;
  if (!dist.count(to)) return r;
  r.cost = dist[to];
  for (std::string n = to; n != from;) {
    const PathSpec* p = via.at(n);
    r.hops.push_back(p);
    n = p->from;
  }
  std::reverse(r.hops.begin(), r.hops.end());
  return r;
}

class Lowerer {
 public:
  Lowerer(Kernel& k, const LowerContext& cx, int64_t L, int64_t Vc)
      : k_(k), cx_(cx), g_(*cx.graph), dev_(*cx.device), L_(L), Vc_(Vc) {
    ub_ = dev_.vector.buffer;
    l0a_ = dev_.matrix.input_a;
    l0b_ = dev_.matrix.input_b;
    l0c_ = dev_.matrix.output;
    stage_ = dev_.staging_buffer();
    // Operands move as fp16 when the matrix unit multiplies fp16 (an NPU's Cube), else as fp32.
    operand_bytes_ = dev_.matrix.macs_per_cycle.count(DType::F16) || dev_.matrix.macs_per_cycle.count(DType::BF16) ? 2 : 4;
    native_ = dev_.matrix.operand_layout == OperandLayout::Dense ? Layout::Dense : Layout::Blocked;
  }

  void run() {
    k_.steps.clear();
    k_.lifetimes.clear();
    start_state();
    bool previous_matrix = false;
    for (const OpId id : k_.order) {
      const OperatorDef& op = g_.op(id);
      if (op.unit == Unit::Matrix) {
        // The inversion's workspace (its 16x16 block inverses and partial products) takes the
        // operand buffers: operands no input of it needs are released first (the paper's lifetime-aware reordering,
        // "released to give the inversion its workspace").
        if (op.id == OpId::Solve || op.id == OpId::SolveInv) release_operands(std::set<std::string>(op.inputs.begin(), op.inputs.end()));
        matrix_op(op);
      } else {
        // Operands stay in L0A/L0B only across GEMMs adjacent in the order: a vector operator in
        // between is a hand-off whose kernels reuse the operand buffers (GEMM-first creates the
        // adjacency that keeps K and Q resident; any other order reloads them).
        if (previous_matrix) release_operands({});
        vector_op(op);
      }
      previous_matrix = op.unit == Unit::Matrix;
    }
    finish();
  }

 private:
  Kernel& k_;
  const LowerContext& cx_;
  const OpGraph& g_;
  const Device& dev_;
  int64_t L_, Vc_;
  std::string ub_, l0a_, l0b_, l0c_, stage_;
  int operand_bytes_ = 2;
  Layout native_ = Layout::Blocked;  // the matrix unit's operand and result layout (device data)
  std::map<std::string, std::map<std::string, Copy>> res_;
  std::map<std::string, std::vector<int>> readers_;  // steps reading each tensor (for in-place writes)
  std::map<std::pair<std::string, std::string>, int> arrival_step_;
  std::map<std::string, OpId> waiting_;  // matrix results waiting in L0C -> their producer
  int clock_ = 0;

  int64_t numel(const std::string& t) const {
    const TensorDef& d = g_.tensor(t);
    return tensor_bytes(d, L_, cx_.K, Vc_) / static_cast<int64_t>(dtype_size(d.dtype));
  }

  bool state_tensor(const std::string& t) const { return g_.tensor(t).role == TensorRole::State; }
  bool on_core(const std::string& loc) const { return loc != kGM; }

  int add(Step s) {
    k_.steps.push_back(std::move(s));
    return static_cast<int>(k_.steps.size()) - 1;
  }
  void dep(int step, int on) {
    if (on < 0 || on == step) return;
    auto& d = k_.steps[static_cast<size_t>(step)].deps;
    if (std::find(d.begin(), d.end(), on) == d.end()) d.push_back(on);
  }
  void read(const std::string& t, const std::string& loc, int step) {
    Copy& c = res_.at(t).at(loc);
    dep(step, c.ready);
    c.last_use = std::max(c.last_use, step);
    c.touch = ++clock_;
    readers_[t].push_back(step);
  }

  void finalize(const std::string& t, const std::string& loc, const Copy& c, bool to_end) {
    if (!on_core(loc)) return;
    Lifetime lt;
    lt.tensor = t;
    lt.buffer = loc;
    lt.first = std::max(0, c.first);
    lt.last = to_end ? static_cast<int>(k_.steps.size()) - 1 : std::max(c.last_use, lt.first);
    lt.bytes = numel(t) * c.elem;
    lt.copies = (c.from_gm && std::find(k_.double_buffered.begin(), k_.double_buffered.end(), t) != k_.double_buffered.end()) ? 2 : 1;
    k_.lifetimes.push_back(lt);
    auto it = arrival_step_.find({t, loc});
    if (it != arrival_step_.end() && it->second >= 0 && c.last_use > it->second)
      k_.steps[static_cast<size_t>(it->second)].reuse_of = c.last_use;
  }

  void drop(const std::string& t, const std::string& loc) {
    auto mt = res_.find(t);
    if (mt == res_.end()) return;
    auto& m = mt->second;
    auto it = m.find(loc);
    if (it == m.end()) return;
    finalize(t, loc, it->second, false);
    m.erase(it);
  }

  double capacity(const std::string& buf) const { return dev_.buffer(buf).capacity_bytes.value; }

  // Makes room in an operand/result buffer by evicting least recently used copies.
  void make_room(const std::string& buf, int64_t bytes, int step, const std::set<std::string>& keep) {
    const double cap = capacity(buf);
    for (;;) {
      int64_t used = 0;
      std::string victim;
      int oldest = std::numeric_limits<int>::max();
      for (auto& [t, locs] : res_) {
        auto it = locs.find(buf);
        if (it == locs.end()) continue;
        used += numel(t) * it->second.elem;
        if (!keep.count(t) && it->second.touch < oldest) oldest = it->second.touch, victim = t;
      }
      if (static_cast<double>(used + bytes) <= cap || victim.empty()) return;
      if (waiting_.count(victim) && buf == l0c_) {
        const OpId producer = waiting_.at(victim);  // a copy: land_result erases the entry
        land_result(victim, producer);                      // a waiting result is moved out, never lost
        continue;
      }
      dep(step, res_[victim][buf].last_use);
      drop(victim, buf);
    }
  }

  void arrive(const std::string& t, const std::string& loc, int step, int elem, Layout layout, bool from_gm,
              const std::set<std::string>& keep = {}) {
    if (!on_core(loc)) {
      Copy c;
      c.ready = step, c.elem = elem, c.layout = Layout::Dense;
      res_[t][loc] = c;
      return;
    }
    if ((loc == l0a_ || loc == l0b_ || loc == l0c_) && loc != ub_ && loc != stage_) make_room(loc, numel(t) * elem, step, keep);
    drop(t, loc);  // an older copy in the same buffer is superseded
    Copy c;
    c.ready = step, c.first = step, c.last_use = step, c.elem = elem, c.layout = layout, c.from_gm = from_gm;
    c.touch = ++clock_;
    res_[t][loc] = c;
    arrival_step_[{t, loc}] = step;
  }

  // Moves t from `from` to `to` along the cheapest route; returns the last step.
  int move(const std::string& t, const std::string& from, const std::string& to, StepOp op, int elem,
           StepWhen when = StepWhen::Every, const std::set<std::string>& keep = {}) {
    if (from == to) return res_.at(t).at(from).ready;  // one buffer serves both (a CPU's cache)
    const Route r = cheapest_route(dev_, from, to);
    if (r.hops.empty())
      throw Error("device " + dev_.name + ": no data path from " + from + " to " + to + " (needed to move tensor " + t +
                  " for operator " + std::string(step_op_name(op)) + ")");
    int last = -1;
    std::string at = from;
    const Layout layout = res_.at(t).at(from).layout;
    const bool gm_origin = from == kGM;
    for (const PathSpec* p : r.hops) {
      Step s;
      s.kind = StepKind::Move, s.op = op, s.tensor = t, s.path = p->name();
      s.lane = StepLane::Dma, s.engine = p->engine.empty() ? p->name() : p->engine;
      s.elem_bytes = elem, s.when = when;
      s.transit = p->to == kGM && to != kGM;
      const int i = add(s);
      read(t, at, i);
      arrive(t, p->to, i, elem, p->to == stage_ || p->to == l0a_ || p->to == l0b_ ? native_ : layout, gm_origin, keep);
      at = p->to;
      last = i;
    }
    return last;
  }

  // Cheapest existing copy to route from.
  std::string best_source(const std::string& t, const std::string& to) const {
    std::string best;
    double cost = std::numeric_limits<double>::infinity();
    for (const auto& [loc, c] : res_.at(t)) {
      const Route r = cheapest_route(dev_, loc, to);
      if (!r.hops.empty() && r.cost < cost) cost = r.cost, best = loc;
    }
    if (best.empty()) throw Error("planner: tensor " + t + " has no copy that can reach " + to);
    return best;
  }

  bool resident(const std::string& t, const std::string& loc) const {
    auto it = res_.find(t);
    return it != res_.end() && it->second.count(loc);
  }

  void require_available(const std::string& t, StepOp op) {
    if (res_.count(t) && !res_[t].empty()) return;
    if (cx_.from_gm.count(t)) {
      Copy c;
      c.elem = cx_.f16_in_gm.count(t) ? 2 : static_cast<int>(dtype_size(g_.tensor(t).dtype));
      res_[t][kGM] = c;
      return;
    }
    throw Error("planner: operator " + std::string(step_op_name(op)) + " in kernel " + k_.name + " reads tensor " + t +
                ", which is neither an input, produced earlier, nor stored by an earlier kernel");
  }

  void ensure_ub(const std::string& t, StepOp op) {
    if (auto w = waiting_.find(t); w != waiting_.end()) {
      const OpId producer = w->second;  // a copy: land_result erases the map entry
      land_result(t, producer);                // its first consumer takes it from L0C
      return;
    }
    require_available(t, op);
    if (resident(t, ub_)) return;
    const std::string src = best_source(t, ub_);
    move(t, src, ub_, op, res_[t][src].elem);
    // A GM input planned blocked in UB (several vector readers share it) is converted once, here.
    if (src == kGM && g_.tensor(t).role == TensorRole::Input && layout_of(t) == Layout::Blocked &&
        res_[t][ub_].layout != Layout::Blocked) {
      Copy& c = res_[t][ub_];
      const int r = transform(t, op, c.ready);
      k_.lifetimes.push_back({t + "(converted)", ub_, r, r + 1, numel(t) * c.elem, 1});
      c.layout = Layout::Blocked;
      c.ready = r;
    }
  }

  Layout layout_of(const std::string& t) const {
    const TensorDef& d = g_.tensor(t);
    if (!is_layout_decision(d) && d.role != TensorRole::Input) return Layout::Dense;
    auto it = cx_.layouts.find(t == "S_next" ? "S" : t);
    return it == cx_.layouts.end() ? Layout::Dense : it->second;
  }

  int transform(const std::string& t, StepOp op, int after) {
    Step s;
    s.kind = StepKind::Transform, s.op = op, s.tensor = t, s.lane = StepLane::Vector;
    s.elem_bytes = res_.at(t).at(ub_).elem;
    const int i = add(s);
    dep(i, after);
    read(t, ub_, i);
    return i;
  }

  // Brings t into an operand buffer as fp16 blocked data.
  int ensure_operand(const std::string& t, const std::string& buf, StepOp op, const std::set<std::string>& keep) {
    require_available(t, op);
    if (resident(t, buf)) {
      res_[t][buf].touch = ++clock_;
      return res_[t][buf].ready;
    }
    if (!resident(t, stage_)) {
      const bool gm_fp16 = resident(t, kGM) && res_[t][kGM].elem == 2;
      if (resident(t, ub_) || !gm_fp16) {
        ensure_ub(t, op);
        Copy& c = res_[t][ub_];
        int ready = c.ready;
        int temp_first = -1;
        if (c.elem == 4 && operand_bytes_ == 2) {  // fp32 -> fp16 for the matrix unit
          Step s;
          s.kind = StepKind::Cast, s.op = op, s.tensor = t, s.lane = StepLane::Vector, s.elem_bytes = 2;
          ready = add(s);
          read(t, ub_, ready);
          temp_first = ready;
        }
        if (c.layout != native_) {
          const int tr = transform(t, op, ready);
          ready = tr;
          if (temp_first < 0) temp_first = tr;
        }
        if (stage_ == ub_) return ready;  // operands are read where the vector unit left them
        const Route r = cheapest_route(dev_, ub_, stage_);
        if (r.hops.empty()) throw Error("device " + dev_.name + ": no data path from " + ub_ + " to " + stage_);
        // The converted copy exists in UB only until it has moved on.
        const Layout saved = c.layout;
        c.layout = native_;
        const int before = static_cast<int>(k_.steps.size());
        move(t, ub_, stage_, op, operand_bytes_);
        dep(before, ready);
        res_[t][ub_].layout = saved;
        if (temp_first >= 0) {
          Lifetime lt{t + "(converted)", ub_, temp_first, before, numel(t) * 2, 1};
          k_.lifetimes.push_back(lt);
        }
      } else {
        move(t, kGM, stage_, op, res_[t][kGM].elem);
      }
    }
    if (stage_ == buf) return res_.at(t).at(buf).ready;  // the operand buffer is the staging buffer (AIE-ML)
    if (spilled(t)) drop(t, ub_);
    return move(t, stage_, buf, op, res_.at(t).at(stage_).elem, StepWhen::Every, keep);
  }

  // Drops every operand-buffer copy except those of `keep` (their last reader is already recorded).
  void release_operands(const std::set<std::string>& keep) {
    for (const std::string& buf : {l0a_, l0b_}) {
      if (buf == ub_ || buf == stage_) continue;  // one buffer serves both units (a CPU's cache)
      std::vector<std::string> victims;
      for (const auto& [t, locs] : res_)
        if (locs.count(buf) && !keep.count(t)) victims.push_back(t);
      for (const std::string& t : victims) drop(t, buf);
    }
  }

  bool spilled(const std::string& t) const { return std::find(k_.spilled.begin(), k_.spilled.end(), t) != k_.spilled.end(); }

  void start_state() {
    const bool uses_state = std::any_of(k_.order.begin(), k_.order.end(), [&](const OpId o) {
      const auto& in = g_.op(o).inputs;
      return std::find(in.begin(), in.end(), "S") != in.end();
    });
    if (!uses_state) return;
    if (k_.state_in == StateIn::None) return;  // read per chunk from GM (require_available)
    Copy gm;
    gm.elem = 4;
    res_["S"][kGM] = gm;
    const int load = move("S", kGM, ub_, StateTraffic::StateIn, 4, StepWhen::First);
    Step z;
    z.kind = StepKind::Zero, z.op = StateTraffic::StateIn, z.tensor = "S", z.lane = StepLane::Vector, z.when = StepWhen::First;
    const int zero = add(z);
    dep(zero, load);
    res_["S"].erase(kGM);
    Copy& c = res_["S"][ub_];
    c.ready = zero, c.carried = true, c.first = 0, c.layout = layout_of("S");
    c.from_gm = false;  // loaded once per item, not per chunk: not double-buffered
    if (cx_.to_gm.count("S")) store("S", StateTraffic::StateSnapshot);
  }

  // Stores t to GM; intermediates kept in GM as fp16 are cast first, the final state never is.
  void store(const std::string& t, StepOp op, StepWhen when = StepWhen::Every, bool fp16_allowed = true) {
    int elem = res_.at(t).at(ub_).elem;
    if (fp16_allowed && cx_.f16_in_gm.count(t) && elem == 4) {
      Step s;
      s.kind = StepKind::Cast, s.op = op, s.tensor = t, s.lane = StepLane::Vector, s.elem_bytes = 2;
      const int i = add(s);
      read(t, ub_, i);
      elem = 2;
      const int before = static_cast<int>(k_.steps.size());
      const Layout saved = res_[t][ub_].layout;
      move(t, ub_, kGM, op, elem, when);
      dep(before, i);
      res_[t][ub_].layout = saved;
      return;
    }
    move(t, ub_, kGM, op, elem, when);
  }

  void produced(const std::string& t, StepOp op) {
    const bool state = state_tensor(t);
    if (state) {
      res_[t][ub_].carried = true;
      if (k_.state_out != StateOut::None) store(t, StateTraffic::StateOut, StepWhen::Last, false);
      return;
    }
    const bool spill = std::find(k_.spilled.begin(), k_.spilled.end(), t) != k_.spilled.end();
    if (cx_.to_gm.count(t) || g_.tensor(t).role == TensorRole::Output || spill) store(t, op);
    if (spill) drop(t, ub_);
  }

  void write_in_place(int step, const std::string& t) {
    for (int r : readers_[t]) dep(step, r);
  }

  void matrix_op(const OperatorDef& op) {
    std::vector<int> ready;
    std::set<std::string> keep(op.inputs.begin(), op.inputs.end());
    for (size_t i = 0; i < op.inputs.size(); ++i)
      ready.push_back(ensure_operand(op.inputs[i], static_cast<int>(i) < op.left ? l0a_ : l0b_, op.id, keep));
    Step s;
    s.kind = StepKind::Compute, s.op = op.id, s.lane = StepLane::Matrix;
    const int c = add(s);
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const std::string buf = static_cast<int>(i) < op.left ? l0a_ : l0b_;
      read(op.inputs[i], buf, c);
      // The state's fp32 master copy stays in UB until its last reader, matrix readers included:
      // its fp16 operand copy is made from it for that GEMM (in state-first order the old state
      // is read by Q S after the next state exists, so both are live).
      if (state_tensor(op.inputs[i]) && buf != ub_ && resident(op.inputs[i], ub_)) {
        Copy& master = res_[op.inputs[i]][ub_];
        master.last_use = std::max(master.last_use, c);
      }
    }
    for (int r : ready) dep(c, r);
    for (const std::string& out : op.outputs) {
      if (l0c_ == ub_) {
        arrive(out, ub_, c, 4, native_, false);
        convert_result(out, op.id);
      } else {
        arrive(out, l0c_, c, 4, native_, false);
        // A result nothing outside the core needs may wait in L0C for its first consumer (the
        // reordering pass decides; it keeps the waiting results within L0C's capacity).
        const bool may_wait = k_.results_wait && !cx_.to_gm.count(out) && g_.tensor(out).role == TensorRole::Intermediate &&
                              !spilled(out);
        if (may_wait) {
          waiting_[out] = op.id;
          continue;
        }
        land_result(out, op.id);
      }
      produced(out, op.id);
    }
  }

  // Moves a matrix result from L0C to the vector buffer and converts it to its planned layout.
  // `op` is taken by value: callers pass the waiting_ entry this erases.
  void land_result(const std::string& out, StepOp op) {
    move(out, l0c_, ub_, op, 4);
    drop(out, l0c_);
    waiting_.erase(out);
    convert_result(out, op);
  }

  void convert_result(const std::string& out, StepOp op) {
    if (layout_of(out) != native_ && is_layout_decision(g_.tensor(out))) {
      transform(out, op, res_[out][ub_].ready);
      res_[out][ub_].layout = layout_of(out);
      res_[out][ub_].ready = static_cast<int>(k_.steps.size()) - 1;
    }
  }

  void vector_op(const OperatorDef& op) {
    const Layout w = working_layout(op, g_, cx_.layouts);
    std::vector<int> ready;
    for (const std::string& in : op.inputs) {
      ensure_ub(in, op.id);
      Copy& c = res_[in][ub_];
      int r = c.ready;
      const TensorDef& d = g_.tensor(in);
      const bool two_d = d.rows != "1" && d.cols != "1";
      if (two_d && c.layout != w && !(state_tensor(in) && g_.state_in_place && std::find(op.outputs.begin(), op.outputs.end(), in) != op.outputs.end())) {
        r = transform(in, op.id, r);
        k_.lifetimes.push_back({in + "(converted)", ub_, r, r + 1, numel(in) * c.elem, 1});
      }
      ready.push_back(r);
    }
    Step s;
    s.kind = StepKind::Compute, s.op = op.id, s.lane = StepLane::Vector;
    const int c = add(s);
    for (const std::string& in : op.inputs) read(in, ub_, c);
    for (int r : ready) dep(c, r);
    // A spilled tensor is reloaded for each consumer and released right after it.
    for (const std::string& in : op.inputs)
      if (spilled(in)) drop(in, ub_);
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      const std::string& out = op.outputs[i];
      const TensorDef& d = g_.tensor(out);
      if (resident(out, ub_)) {  // in-place state update
        write_in_place(c, out);
        Copy& cp = res_[out][ub_];
        cp.ready = c;
        cp.last_use = std::max(cp.last_use, c);
        produced(out, op.id);
        continue;
      }
      const int elem = static_cast<int>(dtype_size(d.dtype));
      arrive(out, ub_, c, elem, w, false);
      const Layout want = layout_of(out);
      if (i > 0 && is_layout_decision(d) && want != w) {
        const int t = transform(out, op.id, c);
        res_[out][ub_].layout = want;
        res_[out][ub_].ready = t;
      }
      produced(out, op.id);
    }
  }

  void finish() {
    for (auto& [t, locs] : res_)
      for (auto& [loc, c] : locs) finalize(t, loc, c, c.carried && t == (g_.state_in_place ? "S" : "S_next"));
    const int last_step = static_cast<int>(k_.steps.size()) - 1;
    // A double-buffered input's second slot receives the next chunk's tile while this chunk runs:
    // it is occupied for the whole chunk, not only during the tensor's own lifetime.
    std::vector<Lifetime> prefetch;
    for (Lifetime& lt : k_.lifetimes)
      if (lt.copies == 2) {
        lt.copies = 1;
        prefetch.push_back({lt.tensor + "(next chunk)", lt.buffer, 0, std::max(0, last_step), lt.bytes, 1});
      }
    for (Lifetime& lt : prefetch) k_.lifetimes.push_back(std::move(lt));
    // Queue and scratch space a kernel reserves for its whole life (device data, per buffer).
    if (last_step >= 0) {
      std::set<std::string> used;
      for (const Lifetime& lt : k_.lifetimes) used.insert(lt.buffer);
      for (const BufferSpec& b : dev_.buffers)
        if (used.count(b.name) && b.reserved_bytes.value > 0)
          k_.lifetimes.push_back({"(reserved)", b.name, 0, last_step, static_cast<int64_t>(b.reserved_bytes.value), 1});
    }
    // Peaks per buffer.
    k_.peak_bytes.clear();
    k_.peak_tensors.clear();
    std::set<std::string> bufs;
    for (const Lifetime& lt : k_.lifetimes) bufs.insert(lt.buffer);
    const int n = static_cast<int>(k_.steps.size());
    for (const std::string& b : bufs) {
      int64_t best = -1;
      int at = 0;
      for (int i = 0; i < n; ++i) {
        int64_t live = 0;
        for (const Lifetime& lt : k_.lifetimes)
          if (lt.buffer == b && lt.first <= i && i <= lt.last) live += lt.bytes * lt.copies;
        if (live > best) best = live, at = i;
      }
      k_.peak_bytes[b] = std::max<int64_t>(0, best);
      std::vector<std::string> names;
      for (const Lifetime& lt : k_.lifetimes)
        if (lt.buffer == b && lt.first <= at && at <= lt.last) names.push_back(lt.tensor);
      k_.peak_tensors[b] = names;
    }
  }
};

}  // namespace

bool is_shared_input(const TensorDef& t, int vector_readers) {
  return t.role == TensorRole::Input && t.rows != "1" && t.cols != "1" && vector_readers > 1;
}

bool is_layout_decision(const TensorDef& t) {
  if (t.role == TensorRole::Input || t.role == TensorRole::Output) return false;
  return t.rows != "1" && t.cols != "1";
}


void lower_kernel(Kernel& k, const LowerContext& cx, int64_t L, int64_t Vc) {
  Lowerer lw(k, cx, L, Vc);
  lw.run();
}

void lower_with_capacity(Kernel& k, const LowerContext& cx, int64_t L, int64_t Vc, bool allow_spill,
                         const std::string& strategy) {
  const Device& dev = *cx.device;
  // The buffer over capacity with the largest excess, or "" if everything fits.
  auto overflow = [&](const Kernel& kk) {
    std::string worst;
    double excess = 0;
    for (const auto& [b, bytes] : kk.peak_bytes) {
      const double cap = dev.buffer(b).capacity_bytes.value;
      if (static_cast<double>(bytes) - cap > excess) excess = static_cast<double>(bytes) - cap, worst = b;
    }
    return worst;
  };
  // Double-buffer every tensor loaded from GM if that fits; otherwise as many as fit, smallest
  // first (a prefetch of a small tile is cheap in space and hides a whole load).
  k.double_buffered.clear();
  lower_kernel(k, cx, L, Vc);
  std::vector<std::pair<int64_t, std::string>> loads;
  for (const Lifetime& lt : k.lifetimes)
    for (const Step& s : k.steps)
      if (s.kind == StepKind::Move && s.tensor == lt.tensor && s.path.rfind("GM->", 0) == 0 && s.op != StepOp(StateTraffic::StateIn) &&
          std::none_of(loads.begin(), loads.end(), [&](const auto& x) { return x.second == lt.tensor; }))
        loads.push_back({lt.bytes, lt.tensor});
  std::sort(loads.begin(), loads.end());
  for (const auto& l : loads) k.double_buffered.push_back(l.second);
  lower_kernel(k, cx, L, Vc);
  if (!overflow(k).empty()) {
    std::vector<std::string> fits;
    for (const auto& l : loads) {
      k.double_buffered = fits;
      k.double_buffered.push_back(l.second);
      lower_kernel(k, cx, L, Vc);
      if (overflow(k).empty()) fits = k.double_buffered;
    }
    k.double_buffered = fits;
    lower_kernel(k, cx, L, Vc);
  }
  k.buffering = k.double_buffered.empty() ? 1 : 2;
  if (overflow(k).empty()) return;
  for (;;) {
    const std::string b = overflow(k);
    if (b.empty()) return;
    // The tensor to spill: live at the peak, not carried, not a converted temporary, largest
    // bytes x lifetime (it frees the most for the longest); it must not be used at the peak step.
    std::string victim;
    double score = 0;
    if (allow_spill) {
      int peak_step = -1;
      int64_t best = -1;
      for (int i = 0; i < static_cast<int>(k.steps.size()); ++i) {
        int64_t live = 0;
        for (const Lifetime& lt : k.lifetimes)
          if (lt.buffer == b && lt.first <= i && i <= lt.last) live += lt.bytes * lt.copies;
        if (live > best) best = live, peak_step = i;
      }
      for (const Lifetime& lt : k.lifetimes) {
        if (lt.buffer != b || lt.first > peak_step || lt.last < peak_step) continue;
        if (lt.tensor.find('(') != std::string::npos) continue;
        const TensorDef& d = cx.graph->tensor(lt.tensor);
        if (d.role != TensorRole::Intermediate) continue;
        if (std::find(k.spilled.begin(), k.spilled.end(), lt.tensor) != k.spilled.end()) continue;
        const Step& at = k.steps[static_cast<size_t>(peak_step)];
        if (at.tensor == lt.tensor) continue;
        const auto& in = cx.graph->op(at.op.is_operator() ? at.op.op : k.order.front()).inputs;
        if (at.kind == StepKind::Compute && std::find(in.begin(), in.end(), lt.tensor) != in.end()) continue;
        const double s = static_cast<double>(lt.bytes) * (lt.last - lt.first + 1);
        if (s > score) score = s, victim = lt.tensor;
      }
    }
    if (victim.empty()) {
      std::ostringstream os;
      os << "plan " << strategy << " on " << dev.name << ": kernel " << k.name << " needs " << k.peak_bytes.at(b)
         << " bytes of " << b << " at its peak, capacity " << static_cast<int64_t>(dev.buffer(b).capacity_bytes.value)
         << "; live at the peak:";
      for (const std::string& t : k.peak_tensors.at(b)) {
        int64_t bytes = 0;
        for (const Lifetime& lt : k.lifetimes)
          if (lt.buffer == b && lt.tensor == t) bytes = std::max(bytes, lt.bytes * lt.copies);
        os << " " << t << " (" << bytes << " B)";
      }
      throw Error(os.str());
    }
    k.spilled.push_back(victim);
    lower_kernel(k, cx, L, Vc);
  }
}

}  // namespace hanpu::plan_detail
