// The simulator (see simulate.hpp for the execution model).
#include "hanpu/simulate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>


namespace hanpu {

namespace {

constexpr const char* kGM = "GM";

// What one step costs for one chunk shape.
struct StepCost {
  double seconds = 0;
  int64_t bytes = 0;
  double macs = 0, executed_macs = 0, vector_ops = 0;
  double energy_j = 0;
  // The fixed costs inside `seconds` (device data, per event) and their event counts.
  double dma_setup_s = 0, gm_segment_s = 0, pipe_sync_s = 0, vector_startup_s = 0;
  double dma_transfers = 0, gm_segments = 0, operator_syncs = 0, vector_sequences = 0;
};

struct StepInfo {
  const Step* step = nullptr;
  int lane = 0;
  const PathSpec* path = nullptr;
  const OperatorDef* op = nullptr;  // compute steps
  int op_index = 0;                 // into per_operator
  bool from_gm = false, to_gm = false, l1_to_l0 = false, ub_l1 = false;
  bool state_load = false, state_store = false, zero = false;
  bool row_penalty = false;
  bool masked_full_tiles = false;  // the kernel's triangular products run as full tiles
  bool spill = false;
  StepWhen when = StepWhen::Every;
  bool is_move = false, is_matrix = false;
  bool handoff = false;  // a move between the matrix and the vector side: waits for a sync flag
  bool double_buffered = false;  // a GM load of a tensor with two buffers: waits two chunks back
};

class Simulator {
 public:
  Simulator(const Plan& plan, const Device& dev, const SimOptions& opt)
      : plan_(plan), dev_(dev), opt_(opt), g_(plan.graph()), p_(plan.problem) {
    hz_ = dev.clock_ghz.value * 1e9;
    if (hz_ <= 0) throw Error("device " + dev.name + ": clock_ghz must be positive");
    auto lanes = dev.vector.lanes.find(DType::F32);
    if (lanes == dev.vector.lanes.end() || lanes->second.value <= 0)
      throw Error("device " + dev.name + ": vector.lanes has no positive F32 entry (the simulator runs vector work in fp32)");
    vec_lanes_ = lanes->second.value;
    // Matrix operands are fp16 where the unit multiplies fp16 (NPU), else fp32 (a CPU's FMA units).
    // (or BF16, the 16-bit format of engines without fp16 such as AIE-ML; operands are cast to it).
    auto macs = dev.matrix.macs_per_cycle.find(DType::F16);
    if (macs == dev.matrix.macs_per_cycle.end()) macs = dev.matrix.macs_per_cycle.find(DType::BF16);
    if (macs == dev.matrix.macs_per_cycle.end()) macs = dev.matrix.macs_per_cycle.find(DType::F32);
    if (macs == dev.matrix.macs_per_cycle.end() || macs->second.value <= 0)
      throw Error("device " + dev.name + ": matrix.macs_per_cycle has no positive F16, BF16 or F32 entry");
    mac_rate_ = macs->second.value * hz_;
    tile_ = std::max<int64_t>(1, static_cast<int64_t>(dev.matrix.tile_n.value));
    handoff_s_ = dev.handoff_sync_cycles.value / hz_;
    dma_setup_s_ = dev.dma_setup_cycles.value / hz_;
    gm_segment_s_ = dev.gm_segment_cycles.value / hz_;
    pipe_sync_s_ = dev.pipe_sync_cycles.value / hz_;
    vector_startup_s_ = dev.vector_startup_cycles.value / hz_;
  }

  SimResult run() {
    if (plan_.device != dev_.name)
      throw Error("plan for device \"" + plan_.device + "\" cannot be simulated on device \"" + dev_.name + "\"");
    // The problem must fit the device's memory (gm_bytes): a plan that cannot run is refused
    // before any accounting, not simulated as if memory were unbounded.
    const GmFit fit = gm_fit(plan_, dev_);
    const int64_t gm_peak = fit.needs_bytes;
    if (!fit.fits)
      throw Error("plan (" + plan_.strategy + "): needs " + std::to_string(gm_peak) + " bytes of device memory (GM) at peak, " +
                  "but device \"" + dev_.name + "\" has gm_bytes " + std::to_string(fit.device_bytes) +
                  "; use fewer tokens or heads");
    // Every on-chip peak must fit its buffer on this device (plans from files are not trusted).
    for (const Kernel& k : plan_.kernels)
      for (const auto& [b, bytes] : k.peak_bytes) {
        const double cap = dev_.buffer(b).capacity_bytes.value;
        if (static_cast<double>(bytes) > cap)
          throw Error("plan (" + plan_.strategy + "): kernel " + k.name + " peaks at " + std::to_string(bytes) + " bytes of " + b +
                      ", but device \"" + dev_.name + "\" has a capacity of " + std::to_string(static_cast<int64_t>(cap)) + " bytes");
      }
    SimResult r;
    r.buffer_policy = buffer_policy_name(opt_.buffer_policy);
    r.strategy = plan_.strategy;
    r.device = dev_.name;
    r.variant = p_.variant;
    r.T = p_.total_tokens();
    r.heads = p_.HV;
    r.sequences = p_.sequences();
    for (const OperatorDef& op : g_.ops) op_index(r, op.id);
    for (const Kernel& k : plan_.kernels) run_kernel(r, k);
    r.macs = 0;
    for (const OperatorStats& o : r.per_operator) r.macs += o.macs;
    r.static_energy_j = dev_.static_power_w.value * r.latency_s;
    r.energy_j = r.dynamic_energy_j + r.static_energy_j;
    const double peak = mac_rate_ * plan_.cores * r.latency_s;
    // The paper's method: utilization from the MACs the hardware executes (recorded by its
    // counters), so a kernel that multiplies masked full tiles is not credited for its zeros in
    // time but is in utilization; the useful fraction is reported beside it.
    r.matrix_utilization = peak > 0 ? r.executed_macs / peak : 0;
    r.useful_matrix_utilization = peak > 0 ? r.macs / peak : 0;
    r.peak_gm_bytes = gm_peak;
    r.gm_intermediate_bytes = r.peak_gm_bytes - io_bytes();
    return r;
  }

  int64_t io_bytes() const {
    const int64_t tok = p_.total_tokens();
    int64_t b = tok * p_.H * p_.K * 2 * static_cast<int64_t>(dtype_size(p_.qkv_dtype));  // q, k
    b += tok * p_.HV * p_.V * static_cast<int64_t>(dtype_size(p_.qkv_dtype));          // v
    b += tok * p_.HV * variant_traits(p_.variant).gate_width(p_.K) * static_cast<int64_t>(dtype_size(p_.gate_dtype));
    b += tok * p_.HV * static_cast<int64_t>(dtype_size(p_.beta_dtype));
    b += tok * p_.HV * p_.V * static_cast<int64_t>(dtype_size(p_.out_dtype));
    const int64_t state = p_.sequences() * p_.HV * p_.K * p_.V * static_cast<int64_t>(dtype_size(p_.state_dtype));
    if (p_.read_initial_state) b += state;
    if (p_.write_final_state) b += state;
    return b;
  }

 private:
  const Plan& plan_;
  const Device& dev_;
  const SimOptions& opt_;
  const OpGraph& g_;  // the plan's (op_graph: built once, shared)
  const Problem& p_;
  double hz_ = 0, vec_lanes_ = 0, mac_rate_ = 0, handoff_s_ = 0;
  double dma_setup_s_ = 0, gm_segment_s_ = 0, pipe_sync_s_ = 0, vector_startup_s_ = 0;
  int64_t tile_ = 16;
  // Rows of SimResult::per_operator, in order of first appearance (the results name them).
  std::vector<std::pair<StepOp, int>> op_index_;

  int op_index(SimResult& r, StepOp op) {
    for (const auto& [o, i] : op_index_)
      if (o == op) return i;
    OperatorStats s;
    s.op = std::string(step_op_name(op));
    if (op.is_operator() && g_.has_op(op.op)) s.paper_op = g_.op(op.op).paper_op;
    r.per_operator.push_back(s);
    op_index_.emplace_back(op, static_cast<int>(r.per_operator.size()) - 1);
    return op_index_.back().second;
  }

  int64_t numel(const std::string& t, int64_t L, int64_t Vc) const {
    const TensorDef& d = g_.tensor(t);
    return tensor_bytes(d, L, p_.K, Vc) / static_cast<int64_t>(dtype_size(d.dtype));
  }

  int64_t dim(const std::string& d, int64_t L, int64_t Vc) const {
    if (d == "L") return L;
    if (d == "K") return p_.K;
    if (d == "V") return Vc;
    return std::stoll(d);
  }

  /// Contiguous segments of one chunk's tile of `t` in GM. Every token-indexed tensor is stored
  /// [T, H, ...] (FLA's and vLLM-Ascend's layout, and the inputs'), so a chunk's rows of one head
  /// are strided by the heads: one segment per row. A K x V block of full width (a state, a
  /// per-chunk state snapshot) is contiguous; a column block of it is one segment per row.
  int64_t gm_segments(const std::string& t, int64_t L, int64_t Vc) const {
    const TensorDef& d = g_.tensor(t);
    const int64_t rows = dim(d.rows, L, Vc);
    if (d.rows == "K" && d.cols == "V" && Vc == p_.V) return 1;
    return std::max<int64_t>(1, rows);
  }

  StepCost cost(const StepInfo& si, int64_t L, int64_t Vc, int busy_cores) const {
    const Step& s = *si.step;
    StepCost c;
    if (s.kind == StepKind::Move) {
      c.bytes = numel(s.tensor, L, Vc) * s.elem_bytes;
      const double bw = si.path->bandwidth_gbs.value * 1e9 / (si.path->shared ? std::max(1, busy_cores) : 1);
      c.seconds = static_cast<double>(c.bytes) / bw;
      c.energy_j = static_cast<double>(c.bytes) * si.path->energy_pj_per_byte.value * 1e-12;
      // Per transfer: its set-up; per extra GM segment: a new burst.
      c.dma_transfers = 1;
      c.dma_setup_s = dma_setup_s_;
      if (si.from_gm || si.to_gm) {
        c.gm_segments = static_cast<double>(gm_segments(s.tensor, L, Vc) - 1);
        c.gm_segment_s = c.gm_segments * gm_segment_s_;
      }
      c.seconds += c.dma_setup_s + c.gm_segment_s;
    } else if (s.kind == StepKind::Compute) {
      const OpCounts oc = op_counts(g_, *si.op, L, p_.K, Vc, tile_, si.masked_full_tiles);
      c.macs = oc.macs, c.executed_macs = oc.executed_macs, c.vector_ops = oc.vector_ops;
      if (si.op->unit == Unit::Matrix) {
        c.seconds = oc.executed_macs / mac_rate_;
        c.energy_j = oc.executed_macs * dev_.matrix.energy_pj_per_mac.value * 1e-12;
      } else {
        c.seconds = oc.vector_ops / vec_lanes_ / hz_ * (si.row_penalty ? kBlockedRowPenalty : 1.0);
        c.energy_j = oc.vector_ops * dev_.vector.energy_pj_per_op.value * 1e-12;
      }
      // Per operator per tile: its flags, barriers and scalar work; on the vector side also
      // the instruction start-up (on a matrix engine that is the vector unit, matrix steps too).
      c.operator_syncs = 1;
      c.pipe_sync_s = pipe_sync_s_;
      if (si.op->unit != Unit::Matrix || dev_.matrix.runs_on_vector_unit) {
        c.vector_sequences = 1;
        c.vector_startup_s = vector_startup_s_;
      }
      c.seconds += c.pipe_sync_s + c.vector_startup_s;
    } else {  // transform, cast, zero: one vector operation per element
      c.vector_ops = static_cast<double>(numel(s.tensor, L, Vc));
      if (s.kind == StepKind::Transform) c.bytes = 2 * numel(s.tensor, L, Vc) * s.elem_bytes;  // read and write in UB
      // A transform moves one fractal row per strided instruction (device data), not a full
      // vector width; casts and zeroing run at the lane width.
      c.seconds = s.kind == StepKind::Transform ? transform_seconds(dev_, c.vector_ops) : c.vector_ops / vec_lanes_ / hz_;
      c.energy_j = c.vector_ops * dev_.vector.energy_pj_per_op.value * 1e-12;
      c.vector_sequences = 1;
      c.vector_startup_s = vector_startup_s_;
      c.seconds += c.vector_startup_s;
    }
    return c;
  }

  void run_kernel(SimResult& r, const Kernel& k) {
    // Lanes and static step information.
    std::vector<std::string> lanes;
    auto lane_id = [&](const std::string& l) {
      auto it = std::find(lanes.begin(), lanes.end(), l);
      if (it != lanes.end()) return static_cast<int>(it - lanes.begin());
      lanes.push_back(l);
      return static_cast<int>(lanes.size()) - 1;
    };
    const std::string stage = dev_.staging_buffer();
    std::vector<StepInfo> info(k.steps.size());
    int state_writer = -1;
    for (size_t i = 0; i < k.steps.size(); ++i) {
      const Step& s = k.steps[i];
      StepInfo& si = info[i];
      si.step = &s;
      // A matrix engine that is the vector unit (AIE-ML) issues on the vector lane.
      si.lane = lane_id(s.lane == StepLane::Matrix && dev_.matrix.runs_on_vector_unit ? std::string("vector") : step_lane_name(s));
      si.op_index = op_index(r, s.op);
      si.masked_full_tiles = k.masked_full_tiles;
      si.when = s.when;
      si.is_move = s.kind == StepKind::Move;
      si.is_matrix = s.lane == StepLane::Matrix;
      if (s.kind == StepKind::Move) {
        const auto arrow = s.path.find("->");
        if (arrow == std::string::npos) throw Error("plan kernel " + k.name + ": step path \"" + s.path + "\" is not FROM->TO");
        const std::string from = s.path.substr(0, arrow), to = s.path.substr(arrow + 2);
        si.path = &dev_.path(from, to);
        si.from_gm = from == kGM, si.to_gm = to == kGM;
        si.double_buffered = si.from_gm && std::find(k.double_buffered.begin(), k.double_buffered.end(), s.tensor) != k.double_buffered.end();
        si.l1_to_l0 = from == stage && (to == dev_.matrix.input_a || to == dev_.matrix.input_b);
        si.ub_l1 = (from == dev_.vector.buffer && to == stage) || (from == stage && to == dev_.vector.buffer);
        si.state_load = s.op == StepOp(StateTraffic::StateIn);
        si.state_store = s.op == StepOp(StateTraffic::StateOut);
        si.spill = std::find(k.spilled.begin(), k.spilled.end(), s.tensor) != k.spilled.end();
        // Results leaving the matrix unit's output buffer, and operands leaving the vector
        // buffer for the matrix side, cross between the units: one flag synchronization each.
        si.handoff = (from == dev_.matrix.output && from != dev_.vector.buffer) ||
                     (from == dev_.vector.buffer && to != kGM && to != dev_.vector.buffer);
      } else if (s.kind == StepKind::Compute) {
        if (!s.op.is_operator()) throw Error("plan kernel " + k.name + ": compute step of " + std::string(step_op_name(s.op)));
        si.op = &g_.op(s.op.op);
        if (si.op->unit == Unit::Vector && si.op->row_structured &&
            working_layout(*si.op, g_, plan_.layouts) == Layout::Blocked)
          si.row_penalty = true;
        if (s.op == StepOp(OpId::StateAdd)) state_writer = static_cast<int>(i);
      } else if (s.kind == StepKind::Zero) {
        si.zero = true;
      }
    }
    int busy = 0;
    for (const auto& l : k.cores) busy += l.empty() ? 0 : 1;
    KernelStats ks;
    ks.name = k.name;
    ks.busy_cores = busy;
    ks.launch_s = k.launch ? dev_.kernel_launch_us.value * 1e-6 : 0;
    ks.boundary_s = dev_.kernel_boundary_us.value * 1e-6;
    r.fixed_cost_s["launch"] += ks.launch_s;
    r.fixed_cost_s["kernel_boundary"] += ks.boundary_s;
    r.fixed_cost_events["launches"] += k.launch ? 1 : 0;
    r.fixed_cost_events["kernel_boundaries"] += 1;

    const size_t n = k.steps.size();
    lane_busy_.assign(lanes.size(), 0.0);
    path_bytes_.assign(lanes.size(), {});
    std::map<std::pair<int64_t, int64_t>, std::vector<StepCost>> cache;
    double kernel_end = 0;
    for (size_t core = 0; core < k.cores.size(); ++core) {
      std::vector<double> lane_free(lanes.size(), 0.0);
      std::array<std::vector<double>, 2> hist;  // end times of the previous two chunks
      hist[0].assign(n, 0.0);
      hist[1].assign(n, 0.0);
      std::vector<double> end(n, 0.0);
      int64_t stream_chunk = 0;
      double core_end = 0;
      // The plan's lockstep groups (Kernel::groups; none: every item alone): a group's items run
      // chunk c one after another before any runs chunk c + 1, so one item's recurrence (its
      // update waits for its previous chunk's) overlaps the other items' work on free lanes.
      const std::vector<PlanItem>& items = k.cores[core];
      std::vector<int32_t> group_sizes = core < k.groups.size() ? k.groups[core] : std::vector<int32_t>{};
      if (group_sizes.empty()) group_sizes.assign(items.size(), 1);
      size_t first_item = 0;
      for (const int32_t group : group_sizes) {
        std::vector<double> ready(static_cast<size_t>(group), 0.0);  // per item: its state's last update
        const PlanItem& lead = items[first_item];
        // Steady-state shortcut: the core's timing is a max-plus system (every time is a max of
        // earlier times plus a constant cost), so once one round (chunk c of every item of the
        // group) leaves the whole state (lane_free, end, the two chunks of history, the items'
        // state-ready times) equal to the previous round's shifted by one period d, every
        // further round of the same chunk shape does the same: those rounds are accounted as
        // multiples and the state shifted by m d. Only chunks of the nominal length strictly
        // between the item's first and last chunk are skipped, so first/last-chunk steps and tail
        // chunks always run.
        int64_t last_regular = lead.chunk1 - 2;  // the last chunk that may be skipped
        for (int32_t gi = 0; gi < group; ++gi) {
          const PlanItem& it = items[first_item + static_cast<size_t>(gi)];
          last_regular = std::min({last_regular, it.chunk1 - 2, p_.chunks_of(it.seq) - 2});
        }
        std::vector<double> previous_state;
        std::vector<std::pair<const StepInfo*, const StepCost*>> round_costs;
        for (int64_t c = lead.chunk0; c < lead.chunk1; ++c) {
          ++r.simulated_rounds;
          round_costs.clear();
          for (size_t gi = 0; gi < static_cast<size_t>(group); ++gi, ++stream_chunk) {
            const size_t ii = first_item + gi;
            const PlanItem& it = items[ii];
            const int64_t Vc = it.col1 - it.col0;
            const int64_t nchunks = p_.chunks_of(it.seq);
            double& state_ready = ready[gi];
            const int64_t L = p_.chunk_len(it.seq, c);
            auto& costs = cache[{L, Vc}];
            if (costs.empty())
              for (size_t i = 0; i < n; ++i) costs.push_back(cost(info[i], L, Vc, busy));
            const bool first = c == it.chunk0, last = c == it.chunk1 - 1;
            const bool load_state = k.state_in == StateIn::Initial && (p_.read_initial_state || it.chunk0 > 0);
            const bool store_state = k.state_out == StateOut::Segment || (k.state_out == StateOut::Final && p_.write_final_state && it.chunk1 == nchunks);
            for (size_t i = 0; i < n; ++i) {
              const StepInfo& si = info[i];
              const Step& s = *si.step;
              bool run = si.when == StepWhen::Every || (si.when == StepWhen::First && first) || (si.when == StepWhen::Last && last);
              if (run && si.state_load) run = load_state;
              if (run && si.zero) run = !load_state;
              if (run && si.state_store) run = store_state;
              if (!run) {
                // A skipped first-chunk step stands for "the state is ready": the previous chunk's update.
                end[i] = si.when == StepWhen::First ? state_ready : 0;
                continue;
              }
              double start = lane_free[static_cast<size_t>(si.lane)];
              double inputs_ready = 0;
              for (int d : s.deps) inputs_ready = std::max(inputs_ready, end[static_cast<size_t>(d)]);
              if (si.handoff) inputs_ready += handoff_s_;  // the flag the other unit sets when done
              start = std::max(start, inputs_ready);
              if (s.reuse_of >= 0) {
                const int depth = si.double_buffered ? 2 : 1;
                if (stream_chunk >= depth) start = std::max(start, hist[static_cast<size_t>(depth - 1)][static_cast<size_t>(s.reuse_of)]);
              }
              const StepCost& sc = costs[i];
              end[i] = start + sc.seconds;
              lane_free[static_cast<size_t>(si.lane)] = end[i];
              core_end = std::max(core_end, end[i]);
              account(r, si, sc);
              round_costs.emplace_back(&si, &sc);
              if (opt_.timeline && stream_chunk < opt_.timeline_chunks && sc.seconds > 0)
                r.timeline.push_back({static_cast<int>(core), k.name, step_lane_name(s), std::string(step_op_name(s.op)), s.kind, s.tensor, static_cast<int64_t>(ii), c,
                                      kernel_start_ + start, kernel_start_ + end[i]});
            }
            if (state_writer >= 0) state_ready = end[static_cast<size_t>(state_writer)];
            std::swap(hist[1], hist[0]);
            hist[0] = end;
          }
          if (!opt_.steady_state_shortcut || c + 1 > last_regular || (opt_.timeline && stream_chunk < opt_.timeline_chunks)) {
            previous_state.clear();
            continue;
          }
          std::vector<double*> state;
          for (double& x : lane_free) state.push_back(&x);
          for (auto& h : hist)
            for (double& x : h) state.push_back(&x);
          for (double& x : end) state.push_back(&x);
          for (double& x : ready) state.push_back(&x);
          state.push_back(&core_end);
          // Rounds from chunk0 + 1 on have identical steps and costs (chunk0 runs first-chunk steps).
          if (c >= lead.chunk0 + 2 && previous_state.size() == state.size()) {
            const int64_t rounds = last_regular - c;
            const double period = periodic_shift(state, previous_state);
            if (period > 0 && rounds > 0) {
              for (size_t i = 0; i < state.size(); ++i)
                if (*state[i] != previous_state[i]) *state[i] += static_cast<double>(rounds) * period;
              for (const auto& [si, sc] : round_costs) account(r, *si, scaled(*sc, rounds));
              stream_chunk += rounds * group;
              c += rounds;
              previous_state.clear();
              continue;
            }
          }
          previous_state.resize(state.size());
          for (size_t i = 0; i < state.size(); ++i) previous_state[i] = *state[i];
        }
        first_item += static_cast<size_t>(group);
      }
      kernel_end = std::max(kernel_end, core_end);
    }
    for (size_t l = 0; l < lanes.size(); ++l) {
      r.busy_s[lanes[l]] += lane_busy_[l];
      for (const auto& [path, bytes] : path_bytes_[l]) r.bytes_per_path[path->name()] += bytes;
    }
    if (opt_.buffer_policy == SimOptions::BufferPolicy::Static) kernel_end += static_policy(r, k, ks, busy);
    ks.latency_s = kernel_end + ks.launch_s + ks.boundary_s;
    kernel_start_ += ks.latency_s;
    r.latency_s += ks.latency_s;
    for (const auto& [b, bytes] : k.peak_bytes) r.peak_bytes[b] = std::max(r.peak_bytes[b], bytes);
    r.kernels.push_back(ks);
  }

  /// Buffer policy Static for one kernel: every tensor copy of its lifetimes (converted copies,
  /// prefetch slots and the reservation included) holds its bytes for the kernel's whole life, as
  /// TPipe/TQue allocations do. A buffer with GM paths both ways that overflows spills the
  /// largest tensors (never the state, a prefetch slot or the reservation) until the rest plus
  /// one staging slot of the largest spilled tensor fits; each spilled tensor is stored and
  /// reloaded every chunk (a GM input only reloaded). That traffic is accounted as GM bytes and
  /// charged as time after the kernel's simulated end, at the core's share of the GM bandwidth
  /// with one DMA set-up per transfer, without overlap (conservative). Returns the added time.
  double static_policy(SimResult& r, const Kernel& k, KernelStats& ks, int busy) {
    std::map<std::string, std::vector<const Lifetime*>> per_buffer;
    for (const Lifetime& lt : k.lifetimes) {
      per_buffer[lt.buffer].push_back(&lt);
      ks.static_bytes[lt.buffer] += lt.bytes * lt.copies;
    }
    double added = 0;
    for (auto& [buf, lts] : per_buffer) {
      const double cap = dev_.buffer(buf).capacity_bytes.value;
      if (static_cast<double>(ks.static_bytes[buf]) <= cap) continue;
      if (!dev_.has_path(kGM, buf) || !dev_.has_path(buf, kGM)) continue;  // no way to spill from it
      std::vector<const Lifetime*> cand;
      for (const Lifetime* lt : lts) {
        const std::string base = lt->tensor.substr(0, lt->tensor.find('('));
        if (base.empty() || lt->tensor.find("(next chunk)") != std::string::npos) continue;
        if (g_.tensor(base).role == TensorRole::State) continue;
        cand.push_back(lt);
      }
      std::stable_sort(cand.begin(), cand.end(), [](const Lifetime* a, const Lifetime* b) { return a->bytes * a->copies > b->bytes * b->copies; });
      int64_t need = ks.static_bytes[buf], slot = 0;
      std::vector<const Lifetime*> spilled;
      for (const Lifetime* lt : cand) {
        if (static_cast<double>(need + slot) <= cap) break;
        need -= lt->bytes * lt->copies;
        slot = std::max(slot, lt->bytes);
        spilled.push_back(lt);
      }
      if (spilled.empty()) continue;
      const double up = dev_.path(buf, kGM).bandwidth_gbs.value * 1e9 / (dev_.path(buf, kGM).shared ? std::max(1, busy) : 1);
      const double down = dev_.path(kGM, buf).bandwidth_gbs.value * 1e9 / (dev_.path(kGM, buf).shared ? std::max(1, busy) : 1);
      double worst = 0;
      for (const auto& items : k.cores) {
        int64_t chunks = 0;
        for (const PlanItem& it : items) chunks += it.chunk1 - it.chunk0;
        double t = 0;
        for (const Lifetime* lt : spilled) {
          const std::string base = lt->tensor.substr(0, lt->tensor.find('('));
          const bool input = g_.tensor(base).role == TensorRole::Input && lt->tensor == base;
          const int64_t read = chunks * lt->bytes, written = input ? 0 : chunks * lt->bytes;
          r.gm_read_bytes += read, r.gm_write_bytes += written;
          r.spill_bytes += read + written, r.static_spill_bytes += read + written, ks.static_spill_bytes += read + written;
          const double transfers = static_cast<double>(chunks) * (input ? 1 : 2);
          t += static_cast<double>(read) / down + static_cast<double>(written) / up + transfers * dma_setup_s_;
          r.fixed_cost_s["dma_setup"] += transfers * dma_setup_s_;
          r.fixed_cost_events["dma_transfers"] += transfers;
        }
        worst = std::max(worst, t);
      }
      for (const Lifetime* lt : spilled) ks.static_spilled.push_back(buf + ":" + lt->tensor);
      added += worst;
    }
    return added;
  }

  /// The period d if every component of `now` is its `before` value plus d, or unchanged and no
  /// later than every component that moved (a lane or buffer idle in the steady rounds, which
  /// then never binds); 0 otherwise. Equality allows for rounding in the accumulated times, far
  /// below the smallest cost a step can have (one vector instruction, ~1 ns).
  static double periodic_shift(const std::vector<double*>& now, const std::vector<double>& before) {
    double period = 0;
    for (size_t i = 0; i < now.size(); ++i) period = std::max(period, *now[i] - before[i]);
    if (period <= 0) return 0;
    double earliest_moved = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < now.size(); ++i) {
      const double delta = *now[i] - before[i];
      if (delta == 0) continue;
      const double tolerance = std::max(1e-12, 1e-13 * std::fabs(*now[i]));
      if (std::fabs(delta - period) > tolerance) return 0;
      earliest_moved = std::min(earliest_moved, before[i]);
    }
    for (size_t i = 0; i < now.size(); ++i)
      if (*now[i] == before[i] && before[i] > earliest_moved) return 0;
    return period;
  }

  static StepCost scaled(const StepCost& c, int64_t times) {
    StepCost s = c;
    const double f = static_cast<double>(times);
    s.seconds *= f, s.macs *= f, s.executed_macs *= f, s.vector_ops *= f, s.energy_j *= f;
    s.dma_setup_s *= f, s.gm_segment_s *= f, s.pipe_sync_s *= f, s.vector_startup_s *= f;
    s.dma_transfers *= f, s.gm_segments *= f, s.operator_syncs *= f, s.vector_sequences *= f;
    s.bytes *= times;
    return s;
  }

  void account(SimResult& r, const StepInfo& si, const StepCost& sc) {
    OperatorStats& o = r.per_operator[static_cast<size_t>(si.op_index)];
    o.busy_s += sc.seconds;
    if (sc.dma_transfers > 0) {
      r.fixed_cost_s["dma_setup"] += sc.dma_setup_s, r.fixed_cost_events["dma_transfers"] += sc.dma_transfers;
      r.fixed_cost_s["gm_segments"] += sc.gm_segment_s, r.fixed_cost_events["gm_segments"] += sc.gm_segments;
    }
    if (sc.operator_syncs > 0) r.fixed_cost_s["pipe_sync"] += sc.pipe_sync_s, r.fixed_cost_events["operator_syncs"] += sc.operator_syncs;
    if (sc.vector_sequences > 0)
      r.fixed_cost_s["vector_startup"] += sc.vector_startup_s, r.fixed_cost_events["vector_sequences"] += sc.vector_sequences;
    o.energy_j += sc.energy_j;
    r.dynamic_energy_j += sc.energy_j;
    lane_busy_[static_cast<size_t>(si.lane)] += sc.seconds;
    if (si.is_move) {
      o.dma_s += sc.seconds;
      path_bytes_[static_cast<size_t>(si.lane)][si.path] += sc.bytes;
      if (si.from_gm) r.gm_read_bytes += sc.bytes, o.gm_read_bytes += sc.bytes;
      if (si.to_gm) r.gm_write_bytes += sc.bytes, o.gm_write_bytes += sc.bytes;
      if (si.l1_to_l0) r.l1_to_l0_bytes += sc.bytes, o.l1_to_l0_bytes += sc.bytes;
      if (si.ub_l1) r.ub_l1_bytes += sc.bytes, o.ub_l1_bytes += sc.bytes;
      if (si.spill && (si.from_gm || si.to_gm)) r.spill_bytes += sc.bytes;
    } else if (si.is_matrix) {
      o.matrix_s += sc.seconds;
      o.macs += sc.macs, o.executed_macs += sc.executed_macs;
      r.executed_macs += sc.executed_macs;
    } else {
      if (si.step->kind == StepKind::Transform) r.transform_bytes += sc.bytes;
      o.vector_s += sc.seconds;
      o.vector_ops += sc.vector_ops;
      r.vector_ops += sc.vector_ops;
    }
  }

  double kernel_start_ = 0;
  std::vector<double> lane_busy_;                                  // per lane of the current kernel
  std::vector<std::map<const PathSpec*, int64_t>> path_bytes_;    // per lane of the current kernel
};

}  // namespace

SimResult simulate(const Plan& plan, const Device& dev, const SimOptions& opt) {
  // A plan for another of the device's coherent core configurations runs at that configuration's
  // clock and bandwidths, never at the default's (which would silently change the peak). A count
  // the file does not describe (a mapping experiment through PlanOptions::cores) keeps the
  // default's numbers.
  const int plan_cores = plan.cores;
  const bool configured = std::any_of(dev.core_configurations.begin(), dev.core_configurations.end(),
                                      [&](const CoreConfiguration& c) { return static_cast<int>(c.cores.value) == plan_cores; });
  if (configured) {
    const Device chosen = device_with_cores(dev, plan_cores);
    Simulator s(plan, chosen, opt);
    return s.run();
  }
  Simulator s(plan, dev, opt);
  return s.run();
}

const char* buffer_policy_name(SimOptions::BufferPolicy p) {
  return p == SimOptions::BufferPolicy::Static ? "static" : "last-reader";
}

SimOptions::BufferPolicy buffer_policy_from_name(const std::string& name) {
  if (name == "static") return SimOptions::BufferPolicy::Static;
  if (name == "last-reader") return SimOptions::BufferPolicy::LastReader;
  throw Error("buffer policy: got \"" + name + "\", expected \"static\" or \"last-reader\"");
}

std::string GmFit::message() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "does not fit: needs %.2f GiB of GM, the device has %.2f GiB", static_cast<double>(needs_bytes) / (1 << 30),
                static_cast<double>(device_bytes) / (1 << 30));
  return buf;
}

GmFit gm_fit(const Plan& plan, const Device& dev) {
  GmFit f;
  f.needs_bytes = plan_peak_gm_bytes(plan);
  f.device_bytes = static_cast<int64_t>(dev.gm_bytes.value);
  f.fits = static_cast<double>(f.needs_bytes) <= dev.gm_bytes.value;
  return f;
}

int64_t plan_peak_gm_bytes(const Plan& plan) {
  const Problem& p = plan.problem;
  const OpGraph& g = plan.graph();
  const int64_t tok = p.total_tokens();
  int64_t b = tok * p.H * p.K * 2 * static_cast<int64_t>(dtype_size(p.qkv_dtype));
  b += tok * p.HV * p.V * static_cast<int64_t>(dtype_size(p.qkv_dtype));
  b += tok * p.HV * variant_traits(p.variant).gate_width(p.K) * static_cast<int64_t>(dtype_size(p.gate_dtype));
  b += tok * p.HV * static_cast<int64_t>(dtype_size(p.beta_dtype));
  b += tok * p.HV * p.V * static_cast<int64_t>(dtype_size(p.out_dtype));
  const int64_t state = p.sequences() * p.HV * p.K * p.V * static_cast<int64_t>(dtype_size(p.state_dtype));
  if (p.read_initial_state) b += state;
  if (p.write_final_state) b += state;
  // Every intermediate a kernel stores to GM (per chunk, or per segment for segment states) lives
  // there until its consumer kernel has run: count all of them. Spills are per-core scratch.
  for (const Kernel& k : plan.kernels) {
    for (const Step& s : k.steps) {
      if (s.kind != StepKind::Move || s.path.size() < 4 || s.path.compare(s.path.size() - 4, 4, "->GM") != 0) continue;
      if (g.tensor(s.tensor).role == TensorRole::Output) continue;
      const bool state_store = s.op == StepOp(StateTraffic::StateOut);
      if (state_store && k.state_out != StateOut::Segment) continue;  // the final state, counted above
      // Spills, and results routed through GM for want of an on-core path (L0C->GM->UB on a 310B),
      // are read back by the same kernel: per-core scratch reused every chunk, not a materialized
      // intermediate.
      const bool spill = s.transit || std::find(k.spilled.begin(), k.spilled.end(), s.tensor) != k.spilled.end();
      const TensorDef& t = g.tensor(s.tensor);
      const int64_t elem_div = static_cast<int64_t>(dtype_size(t.dtype));
      if (spill) {
        int64_t width = 0;
        int busy = 0;
        for (const auto& l : k.cores) {
          busy += l.empty() ? 0 : 1;
          for (const PlanItem& it : l) width = std::max<int64_t>(width, it.col1 - it.col0);
        }
        b += tensor_bytes(t, p.chunk, p.K, width) / elem_div * s.elem_bytes * busy * k.buffering;
        continue;
      }
      for (const auto& l : k.cores)
        for (const PlanItem& it : l) {
          const int64_t Vc = it.col1 - it.col0;
          if (s.when == StepWhen::Last) {
            b += tensor_bytes(t, p.chunk_len(it.seq, it.chunk1 - 1), p.K, Vc) / elem_div * s.elem_bytes;
            continue;
          }
          for (int64_t c = it.chunk0; c < it.chunk1; ++c)
            b += tensor_bytes(t, p.chunk_len(it.seq, c), p.K, Vc) / elem_div * s.elem_bytes;
        }
    }
  }
  return b;
}

nlohmann::json sim_result_to_json(const SimResult& r, bool detail) {
  nlohmann::json j;
  j["strategy"] = r.strategy;
  j["device"] = r.device;
  j["variant"] = variant_name(r.variant);
  j["T"] = r.T;
  j["heads"] = r.heads;
  j["sequences"] = r.sequences;
  j["latency_ms"] = r.latency_s * 1e3;
  j["energy_mj"] = r.energy_j * 1e3;
  j["static_energy_mj"] = r.static_energy_j * 1e3;
  j["gm_read_bytes"] = r.gm_read_bytes;
  j["gm_write_bytes"] = r.gm_write_bytes;
  j["l1_to_l0_bytes"] = r.l1_to_l0_bytes;
  j["ub_l1_bytes"] = r.ub_l1_bytes;
  j["bytes_per_path"] = r.bytes_per_path;
  j["macs"] = r.macs;
  j["executed_macs"] = r.executed_macs;
  j["vector_ops"] = r.vector_ops;
  j["matrix_utilization"] = r.matrix_utilization;
  j["useful_matrix_utilization"] = r.useful_matrix_utilization;
  j["peak_bytes"] = r.peak_bytes;
  j["peak_gm_bytes"] = r.peak_gm_bytes;
  j["gm_intermediate_bytes"] = r.gm_intermediate_bytes;
  j["spill_bytes"] = r.spill_bytes;
  j["transform_bytes"] = r.transform_bytes;
  j["busy_s"] = r.busy_s;
  j["fixed_cost_ms"] = nlohmann::json::object();
  for (const auto& [k, v] : r.fixed_cost_s) j["fixed_cost_ms"][k] = v * 1e3;
  j["fixed_cost_events"] = r.fixed_cost_events;
  j["buffer_policy"] = r.buffer_policy;
  j["static_spill_bytes"] = r.static_spill_bytes;
  j["kernels"] = static_cast<int64_t>(r.kernels.size());
  if (detail) {
    nlohmann::json ops = nlohmann::json::array();
    for (const OperatorStats& o : r.per_operator)
      ops.push_back({{"op", o.op}, {"paper_op", o.paper_op}, {"busy_ms", o.busy_s * 1e3}, {"matrix_ms", o.matrix_s * 1e3},
                     {"vector_ms", o.vector_s * 1e3}, {"dma_ms", o.dma_s * 1e3}, {"macs", o.macs}, {"executed_macs", o.executed_macs}, {"vector_ops", o.vector_ops},
                     {"gm_read_bytes", o.gm_read_bytes}, {"gm_write_bytes", o.gm_write_bytes}, {"l1_to_l0_bytes", o.l1_to_l0_bytes},
                     {"ub_l1_bytes", o.ub_l1_bytes}, {"energy_mj", o.energy_j * 1e3}});
    j["per_operator"] = ops;
    nlohmann::json ks = nlohmann::json::array();
    for (const KernelStats& k : r.kernels)
      ks.push_back({{"name", k.name}, {"latency_ms", k.latency_s * 1e3}, {"launch_ms", k.launch_s * 1e3}, {"boundary_ms", k.boundary_s * 1e3},
                    {"busy_cores", k.busy_cores}, {"static_bytes", k.static_bytes}, {"static_spilled", k.static_spilled},
                    {"static_spill_bytes", k.static_spill_bytes}});
    j["per_kernel"] = ks;
  }
  return j;
}

}  // namespace hanpu
