// Plan <-> JSON. The JSON is the plan exactly (plan_from_json(plan_to_json(p)) == p); every field a
// reader needs is checked, and an error names its JSON path, what it got and what it expected.
#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "hanpu/plan.hpp"
#include "io/json_io.hpp"

namespace hanpu {

namespace {

using json = nlohmann::json;

const char* layout_name(Layout l) { return l == Layout::Blocked ? "blocked" : "dense"; }

// Every value of the Plan's enums read by name, in the order their errors list the names.
constexpr std::array kForms{GraphForm::WU, GraphForm::Inverse, GraphForm::GemmFirst};
constexpr std::array kLayouts{Layout::Dense, Layout::Blocked};
constexpr std::array kParallels{Parallel::Head, Parallel::Segment, Parallel::Chunk};
constexpr std::array kStatesIn{StateIn::None, StateIn::Initial, StateIn::Zero};
constexpr std::array kStatesOut{StateOut::None, StateOut::Final, StateOut::Segment};
constexpr std::array kStepKinds{StepKind::Compute, StepKind::Move, StepKind::Transform, StepKind::Cast, StepKind::Zero};
constexpr std::array kStepWhens{StepWhen::Every, StepWhen::First, StepWhen::Last};

struct Reader {
  std::string origin;

  [[noreturn]] void fail(const std::string& path, const json* got, const std::string& want) const {
    const std::string g = got ? json_summary(*got) : "nothing";  // never dumps a whole value
    throw Error(origin + ": " + path + ": got " + g + ", expected " + want);
  }
  const json& field(const json& j, const std::string& key, const std::string& path) const {
    if (!j.is_object()) fail(path, &j, "an object");
    auto it = j.find(key);
    if (it == j.end()) fail(path + "." + key, nullptr, "a value (the field is required)");
    return *it;
  }
  int64_t integer(const json& j, const std::string& key, const std::string& path) const {
    const json& v = field(j, key, path);
    if (!v.is_number_integer()) fail(path + "." + key, &v, "an integer");
    return v.get<int64_t>();
  }
  // An integer in [lo, hi]: plan fields are stored in 32-bit ints, and a value that does not fit is
  // an error, never silently cut.
  int64_t integer_in(const json& j, const std::string& key, const std::string& path, int64_t lo, int64_t hi) const {
    const json& v = field(j, key, path);
    return integer_value(v, path + "." + key, lo, hi);
  }
  int64_t integer_value(const json& v, const std::string& path, int64_t lo, int64_t hi) const {
    const bool ok = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) &&
                    v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    if (!ok) fail(path, &v, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v.get<int64_t>();
  }
  bool boolean(const json& j, const std::string& key, const std::string& path) const {
    const json& v = field(j, key, path);
    if (!v.is_boolean()) fail(path + "." + key, &v, "true or false");
    return v.get<bool>();
  }
  std::string string(const json& j, const std::string& key, const std::string& path) const {
    const json& v = field(j, key, path);
    if (!v.is_string()) fail(path + "." + key, &v, "a string");
    return v.get<std::string>();
  }
  // The value of E whose name (name_of) the field holds; an unknown name fails listing them all.
  template <class E, size_t N>
  E named(const json& j, const std::string& key, const std::string& path, const std::array<E, N>& values,
          const char* (*name_of)(E)) const {
    const std::string s = string(j, key, path);
    std::string list;
    for (E e : values) {
      if (s == name_of(e)) return e;
      list += (list.empty() ? "" : ", ") + std::string(name_of(e));
    }
    fail(path + "." + key, &j.at(key), "one of " + list);
  }
  const json& array(const json& j, const std::string& key, const std::string& path) const {
    const json& v = field(j, key, path);
    if (!v.is_array()) fail(path + "." + key, &v, "an array");
    return v;
  }
  std::vector<std::string> strings(const json& j, const std::string& key, const std::string& path) const {
    const json& a = array(j, key, path);
    std::vector<std::string> out;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_string()) fail(path + "." + key + "[" + std::to_string(i) + "]", &a[i], "a string");
      out.push_back(a[i].get<std::string>());
    }
    return out;
  }
  DType dtype(const json& j, const std::string& key, const std::string& path) const {
    const std::string s = string(j, key, path);
    try {
      return dtype_from_name(s);
    } catch (const Error&) {
      fail(path + "." + key, &j.at(key), "a dtype name (F16, F32, BF16, ...)");
    }
  }
};

json problem_to_json(const Problem& p) {
  return {{"variant", variant_name(p.variant)},
          {"seqlens", p.seqlens},
          {"varlen", p.varlen},
          {"H", p.H},
          {"HV", p.HV},
          {"K", p.K},
          {"V", p.V},
          {"chunk", p.chunk},
          {"dtypes",
           {{"qkv", dtype_name(p.qkv_dtype)},
            {"o", dtype_name(p.out_dtype)},
            {"g", dtype_name(p.gate_dtype)},
            {"beta", dtype_name(p.beta_dtype)},
            {"state", dtype_name(p.state_dtype)}}},
          {"initial_state", p.read_initial_state},
          {"final_state", p.write_final_state}};
}

Problem problem_from_json(const Reader& r, const json& j, const std::string& path) {
  Problem p;
  const std::optional<Variant> variant = variant_from_name(r.string(j, "variant", path));
  if (!variant) r.fail(path + ".variant", &j.at("variant"), "one of " + variant_names(", "));
  p.variant = *variant;
  const json& sl = r.array(j, "seqlens", path);
  for (size_t i = 0; i < sl.size(); ++i) {
    p.seqlens.push_back(r.integer_value(sl[i], path + ".seqlens[" + std::to_string(i) + "]", 0, kMaxTokens));
  }
  p.varlen = r.boolean(j, "varlen", path);
  p.H = r.integer_in(j, "H", path, 1, kMaxHeads);
  p.HV = r.integer_in(j, "HV", path, 1, kMaxHeads);
  p.K = r.integer_in(j, "K", path, 1, kMaxHeadDim);
  p.V = r.integer_in(j, "V", path, 1, kMaxHeadDim);
  p.chunk = r.integer_in(j, "chunk", path, 1, kMaxHeadDim);
  const json& d = r.field(j, "dtypes", path);
  p.qkv_dtype = r.dtype(d, "qkv", path + ".dtypes");
  p.out_dtype = r.dtype(d, "o", path + ".dtypes");
  p.gate_dtype = r.dtype(d, "g", path + ".dtypes");
  p.beta_dtype = r.dtype(d, "beta", path + ".dtypes");
  p.state_dtype = r.dtype(d, "state", path + ".dtypes");
  p.read_initial_state = r.boolean(j, "initial_state", path);
  p.write_final_state = r.boolean(j, "final_state", path);
  try {
    validate_problem(p);
  } catch (const Error& e) {
    throw Error(r.origin + ": " + e.what());
  }
  return p;
}

}  // namespace

json plan_to_json(const Plan& plan) {
  json j;
  j["problem"] = problem_to_json(plan.problem);
  j["device"] = plan.device;
  j["cores"] = plan.cores;
  j["strategy"] = plan.strategy;
  j["form"] = graph_form_name(plan.form);
  j["state_in_place"] = plan.state_in_place;
  j["layout_planned"] = plan.layout_planned;
  j["allow_spill"] = plan.allow_spill;
  if (plan.cpu.set()) j["cpu"] = cpu_tuning_to_json(plan.cpu);
  json layouts = json::object();
  for (const auto& [t, l] : plan.layouts) layouts[t] = layout_name(l);
  j["layouts"] = layouts;
  json kernels = json::array();
  for (const Kernel& k : plan.kernels) {
    json kj;
    kj["name"] = k.name;
    kj["parallel"] = parallel_name(k.parallel);
    kj["launch"] = k.launch;
    json order = json::array();
    for (const OpId o : k.order) order.push_back(operator_name(o));
    kj["order"] = order;
    kj["buffering"] = k.buffering;
    kj["double_buffered"] = k.double_buffered;
    kj["state_in"] = state_in_name(k.state_in);
    kj["state_out"] = state_out_name(k.state_out);
    kj["spilled"] = k.spilled;
    kj["masked_full_tiles"] = k.masked_full_tiles;
    kj["results_wait"] = k.results_wait;
    json steps = json::array();
    for (const Step& s : k.steps) {
      json sj = {{"kind", step_kind_name(s.kind)}, {"op", step_op_name(s.op)}, {"lane", step_lane_name(s)}, {"when", step_when_name(s.when)}, {"deps", s.deps}};
      if (!s.tensor.empty()) sj["tensor"] = s.tensor;
      if (!s.path.empty()) sj["path"] = s.path;
      if (s.elem_bytes) sj["elem_bytes"] = s.elem_bytes;
      if (s.reuse_of >= 0) sj["reuse_of"] = s.reuse_of;
      if (s.transit) sj["transit"] = true;
      steps.push_back(sj);
    }
    kj["steps"] = steps;
    json lts = json::array();
    for (const Lifetime& lt : k.lifetimes)
      lts.push_back({{"tensor", lt.tensor}, {"buffer", lt.buffer}, {"first", lt.first}, {"last", lt.last}, {"bytes", lt.bytes}, {"copies", lt.copies}});
    kj["lifetimes"] = lts;
    kj["peak_bytes"] = k.peak_bytes;
    kj["peak_tensors"] = k.peak_tensors;
    json cores = json::array();
    for (const auto& list : k.cores) {
      json cl = json::array();
      // Compact: one array per item [seq, head, col0, col1, chunk0, chunk1, tier].
      for (const PlanItem& it : list) cl.push_back({it.seq, it.head, it.col0, it.col1, it.chunk0, it.chunk1, it.tier});
      cores.push_back(cl);
    }
    kj["cores"] = cores;
    if (!k.groups.empty()) kj["groups"] = k.groups;
    kernels.push_back(kj);
  }
  j["kernels"] = kernels;
  return j;
}

Plan plan_from_json(const json& j, const std::string& origin) {
  Reader r{origin};
  const std::string P = "plan";
  if (!j.is_object()) r.fail(P, &j, "an object");
  Plan plan;
  plan.problem = problem_from_json(r, r.field(j, "problem", P), P + ".problem");
  plan.device = r.string(j, "device", P);
  plan.cores = static_cast<int>(r.integer_in(j, "cores", P, 1, kMaxCores));
  plan.strategy = r.string(j, "strategy", P);
  plan.form = r.named(j, "form", P, kForms, graph_form_name);
  plan.state_in_place = r.boolean(j, "state_in_place", P);
  plan.layout_planned = r.boolean(j, "layout_planned", P);
  plan.allow_spill = r.boolean(j, "allow_spill", P);
  // Optional (plans for an NPU, and plans written before the CPU part existed, have none).
  if (j.contains("cpu")) {
    try {
      plan.cpu = cpu_tuning_from_json(j.at("cpu"), P + ".cpu");
      validate_cpu_tuning(plan.cpu, plan.problem.V, P + ".cpu");
    } catch (const Error& e) {
      throw Error(origin + ": " + e.what());
    }
  }
  const OpGraph& g = plan.graph();
  const json& lj = r.field(j, "layouts", P);
  if (!lj.is_object()) r.fail(P + ".layouts", &lj, "an object (tensor -> dense|blocked)");
  for (auto it = lj.begin(); it != lj.end(); ++it) {
    if (!g.has_tensor(it.key())) r.fail(P + ".layouts." + it.key(), &it.value(), "a tensor of the " + std::string(graph_form_name(plan.form)) + " graph");
    plan.layouts[it.key()] = r.named(lj, it.key(), P + ".layouts", kLayouts, layout_name);
  }
  const json& ks = r.array(j, "kernels", P);
  for (size_t ki = 0; ki < ks.size(); ++ki) {
    const std::string kp = P + ".kernels[" + std::to_string(ki) + "]";
    const json& kj = ks[ki];
    Kernel k;
    k.name = r.string(kj, "name", kp);
    k.role = kernel_role_of_name(k.name);  // the JSON edge: the role is carried by the name
    k.parallel = r.named(kj, "parallel", kp, kParallels, parallel_name);
    k.launch = r.boolean(kj, "launch", kp);
    // The JSON edge: operators by name, each one of this graph's (the program holds OpIds).
    const std::vector<std::string> order = r.strings(kj, "order", kp);
    for (size_t i = 0; i < order.size(); ++i) {
      const std::optional<OpId> id = operator_id(order[i]);
      if (!id || !g.has_op(*id))
        r.fail(kp + ".order[" + std::to_string(i) + "]", &kj.at("order")[i], "an operator of the " + std::string(graph_form_name(plan.form)) + " graph");
      k.order.push_back(*id);
    }
    k.buffering = static_cast<int>(r.integer_in(kj, "buffering", kp, 1, 2));
    k.double_buffered = r.strings(kj, "double_buffered", kp);
    k.state_in = r.named(kj, "state_in", kp, kStatesIn, state_in_name);
    k.state_out = r.named(kj, "state_out", kp, kStatesOut, state_out_name);
    k.spilled = r.strings(kj, "spilled", kp);
    // Optional (plans written before it existed executed block triangles everywhere).
    if (kj.contains("masked_full_tiles")) k.masked_full_tiles = r.boolean(kj, "masked_full_tiles", kp);
    if (kj.contains("results_wait")) k.results_wait = r.boolean(kj, "results_wait", kp);
    const json& steps = r.array(kj, "steps", kp);
    for (size_t si = 0; si < steps.size(); ++si) {
      const std::string sp = kp + ".steps[" + std::to_string(si) + "]";
      const json& sj = steps[si];
      Step s;
      s.kind = r.named(sj, "kind", sp, kStepKinds, step_kind_name);
      const std::string op = r.string(sj, "op", sp);
      // The units by name; any other lane is a move's DMA engine, named by the device.
      const std::string lane = r.string(sj, "lane", sp);
      if (lane == "matrix") {
        s.lane = StepLane::Matrix;
      } else if (lane == "vector") {
        s.lane = StepLane::Vector;
      } else if (s.kind == StepKind::Move && !lane.empty()) {
        s.lane = StepLane::Dma, s.engine = lane;
      } else {
        r.fail(sp + ".lane", &sj.at("lane"), std::string("one of matrix, vector") + (s.kind == StepKind::Move ? ", or the name of a DMA engine" : ""));
      }
      s.when = r.named(sj, "when", sp, kStepWhens, step_when_name);
      if (sj.contains("tensor")) {
        s.tensor = r.string(sj, "tensor", sp);
        if (!g.has_tensor(s.tensor)) r.fail(sp + ".tensor", &sj.at("tensor"), "a tensor of the graph");
      } else if (s.kind != StepKind::Compute) {
        r.fail(sp + ".tensor", nullptr, std::string("the tensor a ") + step_kind_name(s.kind) + " step works on");
      }
      // The JSON edge: the operator (or, for other steps, the state's traffic) by name.
      const std::optional<StepOp> step_op = step_op_of_name(op);
      if (s.kind == StepKind::Compute && (!step_op || !step_op->is_operator() || !g.has_op(step_op->op)))
        r.fail(sp + ".op", &sj.at("op"), "an operator of the graph");
      if (!step_op || (step_op->is_operator() && !g.has_op(step_op->op)))
        r.fail(sp + ".op", &sj.at("op"), "an operator of the graph, state_in, state_out or state_snapshot");
      s.op = *step_op;
      if (sj.contains("path")) s.path = r.string(sj, "path", sp);
      else if (s.kind == StepKind::Move) r.fail(sp + ".path", nullptr, "the device path of a move (e.g. \"GM->L1\")");
      if (sj.contains("elem_bytes")) s.elem_bytes = static_cast<int>(r.integer_in(sj, "elem_bytes", sp, 0, 64));
      if (s.kind == StepKind::Move && s.elem_bytes <= 0) r.fail(sp + ".elem_bytes", sj.contains("elem_bytes") ? &sj.at("elem_bytes") : nullptr, "a positive byte count");
      const json& deps = r.array(sj, "deps", sp);
      for (size_t d = 0; d < deps.size(); ++d) {
        if (!deps[d].is_number_integer() || (deps[d].is_number_unsigned() && deps[d].get<uint64_t>() >= si) ||
            deps[d].get<int64_t>() < 0 || deps[d].get<int64_t>() >= static_cast<int64_t>(si))
          r.fail(sp + ".deps[" + std::to_string(d) + "]", &deps[d], "the index of an earlier step (0.." + std::to_string(static_cast<int64_t>(si) - 1) + ")");
        s.deps.push_back(static_cast<int>(deps[d].get<int64_t>()));
      }
      if (sj.contains("reuse_of")) {
        s.reuse_of = static_cast<int>(r.integer_in(sj, "reuse_of", sp, 0, static_cast<int64_t>(steps.size()) - 1));
      }
      if (sj.contains("transit")) s.transit = r.boolean(sj, "transit", sp);
      k.steps.push_back(s);
    }
    const json& lts = r.array(kj, "lifetimes", kp);
    for (size_t li = 0; li < lts.size(); ++li) {
      const std::string lp = kp + ".lifetimes[" + std::to_string(li) + "]";
      Lifetime lt;
      lt.tensor = r.string(lts[li], "tensor", lp);
      lt.buffer = r.string(lts[li], "buffer", lp);
      // Lifetimes span steps of this kernel: first <= last < number of steps.
      const int64_t last_step = static_cast<int64_t>(k.steps.size()) - 1;
      lt.first = static_cast<int>(r.integer_in(lts[li], "first", lp, 0, last_step));
      lt.last = static_cast<int>(r.integer_in(lts[li], "last", lp, lt.first, last_step));
      lt.bytes = r.integer_in(lts[li], "bytes", lp, 0, kMaxPlanBytes);
      lt.copies = static_cast<int>(r.integer_in(lts[li], "copies", lp, 1, 2));
      k.lifetimes.push_back(lt);
    }
    const json& pb = r.field(kj, "peak_bytes", kp);
    if (!pb.is_object()) r.fail(kp + ".peak_bytes", &pb, "an object (buffer -> bytes)");
    for (auto it = pb.begin(); it != pb.end(); ++it) k.peak_bytes[it.key()] = r.integer_in(pb, it.key(), kp + ".peak_bytes", 0, kMaxPlanBytes);
    // Peaks are derived from the lifetimes (src/plan/lower.cpp, finish): a peak edited after
    // planning, or one for a buffer no lifetime uses, is inconsistent and refused.
    {
      std::map<std::string, int64_t> derived;
      for (const Lifetime& lt : k.lifetimes) derived.emplace(lt.buffer, 0);
      for (auto& [b, best] : derived)
        for (size_t i = 0; i < k.steps.size(); ++i) {
          int64_t live = 0;
          for (const Lifetime& lt : k.lifetimes)
            if (lt.buffer == b && lt.first <= static_cast<int>(i) && static_cast<int>(i) <= lt.last) live += lt.bytes * lt.copies;
          best = std::max(best, live);
        }
      for (const auto& [b, bytes] : k.peak_bytes) {
        auto d = derived.find(b);
        if (d == derived.end())
          r.fail(kp + ".peak_bytes." + printable(b), &pb.at(b), "no peak: no lifetime of this kernel is in buffer " + printable(b));
        if (d->second != bytes)
          r.fail(kp + ".peak_bytes." + printable(b), &pb.at(b),
                 std::to_string(d->second) + ", the peak of the kernel's lifetimes in " + printable(b) + " (re-plan after editing)");
      }
      for (const auto& [b, bytes] : derived)
        if (!k.peak_bytes.count(b)) r.fail(kp + ".peak_bytes", &pb, "an entry for buffer " + printable(b) + " (lifetimes use it)");
    }
    const json& pt = r.field(kj, "peak_tensors", kp);
    if (!pt.is_object()) r.fail(kp + ".peak_tensors", &pt, "an object (buffer -> tensor names)");
    for (auto it = pt.begin(); it != pt.end(); ++it) k.peak_tensors[it.key()] = r.strings(pt, it.key(), kp + ".peak_tensors");
    const json& cores = r.array(kj, "cores", kp);
    if (static_cast<int>(cores.size()) != plan.cores)
      r.fail(kp + ".cores", nullptr, std::to_string(plan.cores) + " per-core lists (plan.cores), found " + std::to_string(cores.size()));
    for (size_t ci = 0; ci < cores.size(); ++ci) {
      const std::string cp = kp + ".cores[" + std::to_string(ci) + "]";
      if (!cores[ci].is_array()) r.fail(cp, &cores[ci], "an array of items");
      std::vector<PlanItem> list;
      for (size_t ii = 0; ii < cores[ci].size(); ++ii) {
        const json& a = cores[ci][ii];
        const std::string ip = cp + "[" + std::to_string(ii) + "]";
        if (!a.is_array() || a.size() != 7)
          r.fail(ip, &a, "[seq, head, col0, col1, chunk0, chunk1, tier]");
        // Each field must fit its type (no silent 32-bit cut); validate_plan checks the ranges.
        const int64_t i32 = std::numeric_limits<int32_t>::max();
        const int64_t seq = r.integer_value(a[0], ip + "[0] (seq)", 0, i32), head = r.integer_value(a[1], ip + "[1] (head)", 0, i32);
        const int64_t col0 = r.integer_value(a[2], ip + "[2] (col0)", 0, i32), col1 = r.integer_value(a[3], ip + "[3] (col1)", 0, i32);
        const int64_t c0 = r.integer_value(a[4], ip + "[4] (chunk0)", 0, kMaxTokens), c1 = r.integer_value(a[5], ip + "[5] (chunk1)", 0, kMaxTokens);
        const int64_t tier = r.integer_value(a[6], ip + "[6] (tier)", 0, i32);
        list.push_back({static_cast<int32_t>(seq), static_cast<int32_t>(head), static_cast<int32_t>(col0), static_cast<int32_t>(col1), c0, c1,
                        static_cast<int32_t>(tier)});
      }
      k.cores.push_back(list);
    }
    // Optional (plans written before lockstep groups were a plan field): every item on its own.
    if (kj.contains("groups")) {
      const json& groups = r.array(kj, "groups", kp);
      for (size_t ci = 0; ci < groups.size(); ++ci) {
        const std::string gp = kp + ".groups[" + std::to_string(ci) + "]";
        if (!groups[ci].is_array()) r.fail(gp, &groups[ci], "an array of group sizes");
        std::vector<int32_t> sizes;
        for (size_t gi = 0; gi < groups[ci].size(); ++gi)
          sizes.push_back(static_cast<int32_t>(r.integer_value(groups[ci][gi], gp + "[" + std::to_string(gi) + "]", 1, kMaxHeadChunks)));
        k.groups.push_back(sizes);
      }
    }
    plan.kernels.push_back(k);
  }
  try {
    validate_plan(plan);
  } catch (const Error& e) {
    throw Error(origin + ": " + e.what());
  }
  return plan;
}

}  // namespace hanpu
