// The HA-NPU planner's vocabulary: the LA problem, the operator graph of one chunk, and the Plan
// value every planner (HA-NPU and the baselines) produces and every backend (simulator, CPU)
// consumes (DESIGN.md: algorithm, device, plan and backends are separate).
//
// A Plan stays compact: per kernel it holds one chunk program (the ordered steps of one chunk:
// computes, moves along device paths, layout transforms, casts), the tensors' lifetimes in that
// program, and per core the list of work items (sequence, value head, column range, chunk range)
// it runs through the program, in order. Sizes in the program are symbolic in the chunk length L
// and the item's column width (dims "L", "K", "V", "1"), so one program serves every item.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hanpu/cpu_tuning.hpp"
#include "hanpu/device.hpp"
#include "hanpu/la.hpp"
#include "hanpu/operators.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu {

// ---------------------------------------------------------------------------------------------
// The problem

/// One LA prefill problem (the paper's evaluation defaults: K = V = 128, chunk 64, fp16 q/k/v/o, fp32
/// g/beta/states, an initial state read and a final state written).
struct Problem {
  Variant variant = Variant::GDN;
  std::vector<int64_t> seqlens;  // tokens per sequence (a batch of B sequences of T: B entries)
  bool varlen = false;           // given as cu_seqlens (one flattened batch) rather than B x T
  int64_t H = 16, HV = 16, K = 128, V = 128;
  int64_t chunk = 64;
  DType qkv_dtype = DType::F16, out_dtype = DType::F16;
  DType gate_dtype = DType::F32, beta_dtype = DType::F32, state_dtype = DType::F32;
  bool read_initial_state = true;
  bool write_final_state = true;

  int64_t sequences() const { return static_cast<int64_t>(seqlens.size()); }
  int64_t total_tokens() const;
  int64_t chunks_of(int64_t seq) const;  // ceil(len / chunk); 0 for an empty sequence
  int64_t total_chunks() const;          // summed over sequences
  /// Tokens of chunk c of sequence seq (chunk, except a partial last chunk).
  int64_t chunk_len(int64_t seq, int64_t c) const;
  bool operator==(const Problem&) const = default;
};

/// Limits on problem sizes (docs/RELIABILITY.md, "Input limits"), checked by validate_problem
/// before anything is planned, simulated or allocated: the planner and simulator do work per
/// (head, chunk), so unbounded sizes would run for minutes or exhaust memory. They are far above
/// the models hanpu targets (Qwen3.5: 16-64 heads of 128, contexts up to 262,144 tokens).
constexpr int64_t kMaxTokens = int64_t{1} << 21;      // total tokens of a problem (2,097,152)
constexpr int64_t kMaxSequences = int64_t{1} << 16;   // sequences of a batch
constexpr int64_t kMaxHeads = 1024;                   // H and HV
constexpr int64_t kMaxHeadDim = 1024;                 // K, V and chunk
constexpr int64_t kMaxCores = 4096;                   // cores of a plan
constexpr int64_t kMaxPlanBytes = int64_t{1} << 50;   // any byte count in a plan (1 PiB)
/// Planned work items: value heads x chunks of all sequences (the planner's and simulator's cost).
constexpr int64_t kMaxHeadChunks = int64_t{1} << 22;

/// Throws hanpu::Error naming the field (e.g. "problem.HV: got 6, expected a multiple of H = 4").
void validate_problem(const Problem& p);

// ---------------------------------------------------------------------------------------------
// The operator graph of one chunk (the paper's chunkwise computation; FLA's fla/ops/gated_delta_rule and fla/ops/kda chunk kernels)

enum class TensorRole { Input, Output, State, Intermediate };
enum class Layout { Dense, Blocked };  // dense row-major (ND) / 16x16 fractal blocks (NZ)

/// How the chunk is computed (all three give the same results up to rounding):
///   WU        FLA's form: T = (I + A)^-1 formed, W = T diag(beta e^G) K, U = T diag(beta) V,
///             v_new = U - W S;
///   Inverse   T formed but W, U never: v_new = T (diag(beta) V - diag(beta e^G) K S) (FlashQLA);
///   GemmFirst HA-NPU's rewrite: v_new solved from (I + A) v_new = diag(beta) V - diag(beta e^G) K S
///             by block forward substitution; T never formed, K S / Q S / K K^T / Q K^T grouped.
/// (GraphForm and Unit are declared in hanpu/operators.hpp, next to the operator manifest.)
const char* graph_form_name(GraphForm f);  // "wu" / "inverse" / "gemm_first"

/// A tensor of one chunk. Dims are symbolic: "L" (tokens of the chunk), "K", "V" (the item's
/// column width), "1"; e.g. q is L x K, the state K x V.
struct TensorDef {
  std::string name;
  std::string rows, cols;
  DType dtype = DType::F32;
  TensorRole role = TensorRole::Intermediate;
  bool operator==(const TensorDef&) const = default;
};

/// A fine-grained operator on one unit. paper_op names the paper's operator (#1-#6 of its chunkwise computation) it belongs to
/// ("1".."4", "5r" = #5 read, "5u" = #5 update, "6"). id, name, paper_op and unit are its row of
/// the operator manifest (hanpu/operators.hpp).
struct OperatorDef {
  OpId id = OpId::Gate;
  std::string name;
  std::string paper_op;
  Unit unit = Unit::Vector;
  std::vector<std::string> inputs, outputs;
  /// Vector work indexed by rows/columns (masks, row scales, cumsum, substitution): slower on
  /// blocked data. Element-wise work is not.
  bool row_structured = false;
  /// Matrix operators: the first `left` inputs are left operands (L0A), the rest right (L0B).
  int left = 1;
  bool operator==(const OperatorDef&) const = default;
};

/// Work of one operator on one chunk: useful multiply-adds (exact triangles), multiply-adds the
/// matrix unit executes (dims rounded to its tile; triangles at tile-block granularity, or full
/// tiles for a kernel that masks afterwards), vector element operations.
struct OpCounts {
  double macs = 0, executed_macs = 0, vector_ops = 0;
};

struct OpGraph {
  Variant variant = Variant::GDN;
  GraphForm form = GraphForm::GemmFirst;
  bool state_in_place = true;  // state updated in place (the update runs after the output)
  std::vector<TensorDef> tensors;
  std::vector<OperatorDef> ops;  // in a valid default order

  const TensorDef& tensor(const std::string& name) const;  // throws hanpu::Error if unknown
  /// The operator with that id; throws hanpu::Error naming it if this graph has none.
  const OperatorDef& op(OpId id) const;
  bool has_op(OpId id) const;
  bool has_tensor(const std::string& name) const;
};

/// KDA's operators forming the channel-decayed operands, one per operand: decay_q (q e^G),
/// decay_ke (k e^G), decay_ki (k e^-G), decay_kl (k e^(G_L - G)). Separate operators so an order
/// can build each just before its consumers and a kernel only those it multiplies.
/// (The manifest's rows with GateKind::Channel, in manifest order.)
const std::vector<OpId>& kda_decay_operators();

/// The chunk graph of a variant in a form. With state_in_place the update overwrites "S";
/// otherwise it writes "S_next", which becomes the next chunk's "S".
OpGraph make_op_graph(Variant variant, GraphForm form, bool state_in_place);
/// The same graph, built once per process (for every variant, form and state handling) and shared:
/// what Plan::graph() returns.
const OpGraph& op_graph(Variant variant, GraphForm form, bool state_in_place);

/// An operator order and the peak bytes the reordering model gives it: in the vector buffer (UB)
/// and in the matrix unit's result buffer (L0C), where matrix results wait for their first
/// consumer. The model counts each tensor as it is stored (dtype size) from its producer (or its
/// first reader, for inputs) to its last reader; the state the next chunk reads stays to the end.
struct ReorderResult {
  std::vector<OpId> order;
  int64_t peak_vector_bytes = 0, peak_result_bytes = 0;
  int handoffs = 0;  // switches between the matrix and the vector unit along the order
};

/// Lifetime-aware reordering (the paper's lifetime-aware reordering): the dependency-respecting order of `g`'s
/// operators (an in-place update after every reader of the old state) with the least peak UB
/// bytes, among those the fewest matrix<->vector hand-offs, then the least peak L0C bytes, waiting
/// matrix results never exceeding `result_capacity` bytes; exact for (peak, hand-offs) (dynamic
/// programs over operator sets). `results_wait` false: the device has no result buffer of its own
/// (AIE-ML), matrix results land in the vector buffer at once. Throws
/// hanpu::Error if no order fits or the graph has more than 22 operators.
ReorderResult lifetime_aware_order(const OpGraph& g, int64_t L, int64_t K, int64_t V, int64_t result_capacity,
                                   bool results_wait = true);

/// The same model's peaks for a given order (throws naming an operator run before its inputs).
ReorderResult order_occupancy(const OpGraph& g, const std::vector<OpId>& order, int64_t L, int64_t K, int64_t V,
                              bool results_wait = true);

/// Counts of `op` for a chunk of L tokens and an item of Vc columns; `tile` is the matrix unit's
/// fractal edge (16 on DaVinci) used for the executed count.
/// `masked_full_tiles`: triangular products executed as full tiles (Kernel::masked_full_tiles).
OpCounts op_counts(const OpGraph& g, const OperatorDef& op, int64_t L, int64_t K, int64_t Vc, int64_t tile,
                   bool masked_full_tiles = false);

/// Bytes of a tensor for a chunk of L tokens and Vc columns.
int64_t tensor_bytes(const TensorDef& t, int64_t L, int64_t K, int64_t Vc);

/// Useful multiply-adds of the whole layer (every sequence, value head and chunk) in a form: the
/// sum of op_counts(...).macs. docs/SIMULATION.md gives the closed formula.
double layer_macs(const Problem& p, GraphForm form);

// ---------------------------------------------------------------------------------------------
// The plan

/// A unit of work of one core in one kernel: chunks [chunk0, chunk1) of one (sequence, value
/// head) restricted to state columns [col0, col1). tier: 1 whole head, 2 column split of a tail
/// head, 3 chunk-parallel fallback; 0 for baseline mappings.
struct PlanItem {
  int32_t seq = 0, head = 0, col0 = 0, col1 = 0;
  int64_t chunk0 = 0, chunk1 = 0;
  int32_t tier = 0;
  bool operator==(const PlanItem&) const = default;
};

/// What a step does:
///   Compute:   runs operator `op` on the matrix or the vector lane;
///   Move:      copies `tensor` along device path `path` (lane Dma: the path's DMA engine), moving
///              elem_bytes per element;
///   Transform: converts `tensor` between dense and blocked in UB (vector lane, one op/element);
///   Cast:      converts an fp32 `tensor` to fp16 for the matrix unit (vector lane);
///   Zero:      clears the state (first chunk of an item without an initial state).
enum class StepKind { Compute, Move, Transform, Cast, Zero };
/// Where a step issues: the matrix unit, the vector unit, or a DMA engine (Step::engine names it;
/// engines are the device's, so their names stay strings).
enum class StepLane { Matrix, Vector, Dma };
/// Which chunks of an item a step runs on: every chunk, only the first or only the last.
enum class StepWhen { Every, First, Last };
/// The names at the JSON edge: "compute" / "move" / "transform" / "cast" / "zero"; "every" /
/// "first" / "last".
const char* step_kind_name(StepKind k);
const char* step_when_name(StepWhen w);

/// What a step serves: an operator of the graph (its compute step, and the moves, casts and
/// conversions of its operands and results), or the state's own traffic: StateIn (loading or
/// zeroing the carried state at the first chunk), StateOut (storing it at the last), StateSnapshot
/// (storing it every chunk for a later kernel). Typed, so a renamed operator is a compile error;
/// names only at the JSON edge and in the simulator's results (step_op_name, step_op_of_name).
enum class StateTraffic : uint8_t { None, StateIn, StateOut, StateSnapshot };
struct StepOp {
  OpId op = OpId::Gate;                      // the operator (state == None)
  StateTraffic state = StateTraffic::None;  // otherwise the state traffic (op stays Gate)
  constexpr StepOp() = default;
  constexpr StepOp(OpId id) : op(id) {}  // NOLINT(google-explicit-constructor): a step serves an operator
  constexpr StepOp(StateTraffic s) : state(s) {}  // NOLINT(google-explicit-constructor)
  constexpr bool is_operator() const { return state == StateTraffic::None; }
  bool operator==(const StepOp&) const = default;
};
/// "state_in" / "state_out" / "state_snapshot", or the operator's manifest name.
std::string_view step_op_name(StepOp s);
/// The StepOp of a name (an operator of the manifest or a state traffic name); nullopt otherwise.
std::optional<StepOp> step_op_of_name(std::string_view name);

/// One step of a kernel's chunk program.
/// deps: earlier steps of the same chunk it waits for. reuse_of: the step whose buffer this step
/// overwrites in a later chunk (-1 none): it waits for that step `buffering` chunks earlier.
struct Step {
  StepKind kind = StepKind::Compute;
  StepOp op;
  std::string tensor;
  StepLane lane = StepLane::Vector;
  std::string engine;  // lane Dma: the DMA engine (the path's engine, or the path's name if it has none)
  std::string path;
  StepWhen when = StepWhen::Every;
  int elem_bytes = 0;
  std::vector<int> deps;
  int reuse_of = -1;
  /// A hop into GM on the way elsewhere (no on-core path, e.g. L0C->GM->UB): per-core scratch.
  bool transit = false;
  bool operator==(const Step&) const = default;
};
/// The name of a step's lane at the JSON edge and in the simulator's results: "matrix", "vector"
/// or the DMA engine's name.
std::string step_lane_name(const Step& s);

/// A tensor copy in an on-core buffer: live from step first to step last of the chunk program
/// (a tensor carried to the next chunk is live to the end), bytes at the nominal chunk and the
/// kernel's widest item, copies = 2 when double-buffered.
struct Lifetime {
  std::string tensor, buffer;
  int first = 0, last = 0;
  int64_t bytes = 0;
  int copies = 1;
  bool operator==(const Lifetime&) const = default;
};

/// How a kernel's items are parallel: Head, items carry the state chunk to chunk; Segment, the
/// same over a chunk range with the segment's start state from GM; Chunk, every chunk independent.
enum class Parallel { Head, Segment, Chunk };
/// Where a kernel's state comes from: None (not carried), Initial (the initial state, or for a
/// segment not at the start the chained state from GM), Zero (a zero start state).
enum class StateIn { None, Initial, Zero };
/// Where it goes: None, Final (the final state), Segment (a segment's end state to GM).
enum class StateOut { None, Final, Segment };
/// The names at the JSON edge: "head" / "segment" / "chunk"; "none" / "initial" / "zero";
/// "none" / "final" / "segment".
const char* parallel_name(Parallel p);
const char* state_in_name(StateIn s);
const char* state_out_name(StateOut s);

/// What a kernel is to the backends: one of a strategy's own kernels (Named: fla's fwd_h, ...),
/// the head-mapped strategies' fused kernel (every operator, head-parallel, with lockstep groups),
/// or one of the three chunk-parallel kernels that run their tier-3 heads (Map, state
/// recurrence, output). In the JSON only the kernel's name says it: the fused kernel is named
/// "fused", the tail kernels "tail_map", "tail_state", "tail_output" (kernel_role_of_name).
enum class KernelRole { Named, Fused, TailMap, TailState, TailOutput };
/// The name a kernel of that role carries ("fused", "tail_map", ...; "" for Named).
const char* kernel_role_name(KernelRole r);
/// The role of a kernel name as plan_from_json reads it (Named for any other name).
KernelRole kernel_role_of_name(const std::string& name);

struct Kernel {
  std::string name;
  KernelRole role = KernelRole::Named;  // kept in step with name: kernel_role_of_name(name)
  Parallel parallel = Parallel::Head;
  bool launch = true;  // pays a kernel launch (false inside a megakernel after its first phase)
  std::vector<OpId> order;  // operators in program order (names only in the JSON)
  std::vector<Step> steps;
  std::vector<Lifetime> lifetimes;
  std::map<std::string, int64_t> peak_bytes;                   // buffer -> peak live bytes
  std::map<std::string, std::vector<std::string>> peak_tensors;  // buffer -> tensors live at the peak
  std::vector<std::string> spilled;  // tensors kept in GM between producer and consumers
  int buffering = 1;                 // 2: some GM inputs double-buffered (prefetch of the next chunk)
  std::vector<std::string> double_buffered;  // those tensors (two copies each in their buffers)
  StateIn state_in = StateIn::None;
  StateOut state_out = StateOut::None;
  std::vector<std::vector<PlanItem>> cores;  // per core, in order
  /// Lockstep groups of a head-parallel kernel, per core: the sizes of consecutive runs of that
  /// core's items (same sequence, columns and chunks) that advance chunk by chunk together, every
  /// item of a group with its own state live in the working buffer. The sizes of a core sum to its
  /// item count; an empty list (or an empty `groups`) runs every item on its own (groups of 1).
  std::vector<std::vector<int32_t>> groups;
  /// How the kernel's matrix unit executes triangular products (K K^T, Q K^T, T X, P v_new):
  /// true for general-purpose kernels (torch ops, Triton-style tiles) that multiply full L x L
  /// tiles and mask afterwards; false for HA-NPU's own routines, which skip the 16 x 16 blocks
  /// above the diagonal. Executed MACs (time, energy, utilization) follow it; useful MACs do not.
  bool masked_full_tiles = false;
  /// Matrix results needed only on this core wait in the matrix unit's output buffer (L0C) until
  /// their first consumer instead of moving to the vector buffer at once (set by the reordering
  /// pass, whose order keeps them within L0C's capacity).
  bool results_wait = false;
  bool operator==(const Kernel&) const = default;
};

struct Plan {
  Problem problem;
  std::string device;    // device name the plan was made for
  int cores = 0;         // cores planned for
  std::string strategy;  // "hanpu", "fla", ... or an ablation step
  GraphForm form = GraphForm::GemmFirst;
  bool state_in_place = true;
  bool layout_planned = false;
  bool allow_spill = false;
  std::map<std::string, Layout> layouts;  // on-core layout of every intermediate/state tensor
  std::vector<Kernel> kernels;            // run one after another
  /// The CPU backend's free parameters with their reasons (set for CPU devices; JSON "cpu").
  CpuTuning cpu;
  bool operator==(const Plan&) const = default;

  /// The plan's operator graph: a function of (problem.variant, form, state_in_place), built once
  /// per process and shared by every consumer (op_graph), so no consumer rebuilds it.
  const OpGraph& graph() const { return op_graph(problem.variant, form, state_in_place); }
};

// ---------------------------------------------------------------------------------------------
// Planners

/// Strategy names: "vllm-ascend", "fla", "fla-megakernel", "flashqla", "hanpu", and the ablation
/// steps "fla+mapping", "fla+mapping+reordering", "fla+mapping+reordering+layout".
std::vector<std::string> strategy_names();
std::vector<std::string> ablation_names();

struct PlanOptions;

/// The planning rules of the backend that executes plans on a kind of device. The planner asks
/// it, never which kind of device it is; an NPU description is planned by the planner's own passes
/// (no backend). The CPU backend's is cpu_plan_backend() (hanpu/plan_exec.hpp,
/// src/cpu/cpu_planning.cpp), where the facts of its kernels live.
class PlanBackend {
 public:
  virtual ~PlanBackend() = default;
  /// The plan's CPU parameters (Plan::cpu) for `p` on `dev` with `cores`: chosen from the device
  /// description, then opt.wisdom's and opt.cpu's values. Throws naming the field out of range.
  virtual CpuTuning tune(const Problem& p, const Device& dev, int cores, const PlanOptions& opt) const = 0;
  /// The head-fused kernel's operator order when PlanOptions::order gives none. Empty: the
  /// planner's own (the lifetime-aware reordering pass where the strategy has it).
  virtual std::vector<OpId> fused_order(const OpGraph& g) const = 0;
  /// Reorders one core's head-fused items after they were cut into column blocks (e.g. so that
  /// like blocks of neighbouring heads become adjacent and can share a lockstep group).
  virtual void order_column_blocks(std::vector<PlanItem>& items) const = 0;
};

struct PlanOptions {
  int cores = 0;  // 0: the device's core count
  /// Head-mapped strategies: the operator order of the fused kernel instead of the graph's
  /// default (any order in which every operator follows the producers of its inputs; make_plan
  /// throws naming the operator otherwise). Empty: the default order.
  std::vector<OpId> order;
  /// The rules of the backend that will execute the plan; required for a CPU device (make_plan
  /// throws naming this field otherwise), none for an NPU.
  const PlanBackend* backend = nullptr;
  /// CPU devices: parameters given explicitly (`hanpu tune`'s candidates); a field left at 0 is
  /// chosen by the model (or the wisdom). Null: all chosen.
  const CpuTuning* cpu = nullptr;
  /// CPU devices: wisdom the caller loaded (read_wisdom; the planner reads no file and no
  /// environment), and the file it came from (named in the reasons). Null: model-based choices.
  std::shared_ptr<const Wisdom> wisdom;
  std::string wisdom_origin;
};

/// Plans `p` on `dev` with a strategy. Throws hanpu::Error for an unknown strategy, an invalid
/// problem, or (strategies that do not spill, e.g. hanpu) a live set exceeding a buffer, naming
/// the buffer, its capacity and the tensors live at the peak.
Plan make_plan(const Problem& p, const Device& dev, const std::string& strategy, const PlanOptions& opt = {});

/// Head-level mapping with the three tail tiers (the paper's head-level mapping) of every (sequence, value head)
/// onto `cores` cores; column blocks are multiples of `quantum` columns. Items of tier 3 are
/// returned in `chunk_parallel` (whole heads), to be run by the fallback kernels.
struct HeadMapping {
  std::vector<std::vector<PlanItem>> cores;
  std::vector<PlanItem> chunk_parallel;
};
HeadMapping map_heads(const Problem& p, int cores, int quantum);

/// Lockstep groups of one core's items (Kernel::groups): every run of consecutive items with the
/// same sequence, columns and chunks is cut into the fewest groups of at most `max_group` items, of
/// near-equal sizes (8 items with max_group 7: 4 + 4, not 7 + 1).
std::vector<int32_t> lockstep_groups(const std::vector<PlanItem>& items, int max_group);

/// The largest lockstep group on `dev` for items of K x width fp32 states: as many states as a
/// quarter of the matrix unit's working buffer holds (the rest holds the chunk's intermediates and
/// the rows in flight), at least 1, at most 64. `state_bytes`: one state as the buffer holds it
/// (0: K x width x 4, a scratchpad's rows as they are; a cache pads them: the CPU's rules pass its own).
int max_lockstep_group(const Device& dev, int64_t K, int64_t width, int64_t state_bytes = 0);

/// The working layout of a vector operator (that of its first output; dense for outputs), given a
/// plan's layouts.
Layout working_layout(const OperatorDef& op, const OpGraph& g, const std::map<std::string, Layout>& layouts);

/// Chunk-parallel mapping (FLA's Map phases): the (sequence, head, column block, chunk) tasks of
/// `items` in order, cut into `cores` contiguous, equally sized ranges.
std::vector<std::vector<PlanItem>> map_chunks(const Problem& p, const std::vector<PlanItem>& items, int cores);

/// Throws hanpu::Error unless every kernel covers no (sequence, head, column, chunk) twice, the
/// output operator covers every one exactly once, every operator covers every one at least once,
/// and every tensor a kernel reads is an input, produced earlier in its order, carried, or
/// produced by an earlier kernel.
void validate_plan(const Plan& plan);

/// Human-readable summary: mapping with tiers, order, lifetimes and peaks per buffer, layouts,
/// total MACs.
std::string describe_plan(const Plan& plan);

nlohmann::json plan_to_json(const Plan& plan);
/// Parses a plan; errors name the field ("plan.kernels[1].steps[4].kind: got \"mov\", expected ...").
Plan plan_from_json(const nlohmann::json& j, const std::string& origin = "plan");

// ---------------------------------------------------------------------------------------------
// Layout planning (the paper's layout planning)

/// The layout problem of one chunk after the prunings: one decision per on-core tensor (dense or
/// blocked). unary[t][l] is the cost of tensor t in layout l on its own (conversion after a
/// matrix producer, one conversion for all its matrix consumers, slower row-structured vector
/// work); a pair (a, b) couples two tensors through an element-wise vector operator (a converted
/// copy when their layouts differ). Tensors are in production order.
struct LayoutProblem {
  std::vector<std::string> tensors;
  std::vector<std::array<double, 2>> unary;
  struct Pair {
    int a = 0, b = 0;
    std::array<double, 4> cost{};  // index la * 2 + lb
  };
  std::vector<Pair> pairs;
};
struct LayoutSolution {
  std::vector<Layout> layout;
  double cost = 0;
};
/// Dynamic program over the tensors in order, D_i(s) = min_p D_{i-1}(p) + c_i(p, s), where the
/// state s is the layouts of the open tensors (those still coupled to a later one); backtracks to
/// the assignment. Exact.
LayoutSolution solve_layouts_dp(const LayoutProblem& lp);
/// Every assignment (2^n), for checking the DP on small problems.
LayoutSolution solve_layouts_exhaustive(const LayoutProblem& lp);
/// The layout problem of a graph's chunk program on a device (costs in seconds per chunk).
LayoutProblem layout_problem(const OpGraph& g, const std::vector<OpId>& order, const Device& dev,
                             int64_t chunk, int64_t K, int64_t V);

/// Vector work that indexes rows (masks, row scales, substitution) costs this factor more on
/// blocked data: a 16x16 fractal holds 16 rows of 16 elements, so a row-wise operation issues one
/// 16-element instruction per fractal row instead of one full-width instruction per row segment.
/// A model constant (not a hardware figure); docs/SIMULATION.md discusses it.
inline constexpr double kBlockedRowPenalty = 2.0;

/// Seconds a dense<->blocked transform of `elements` takes on the device's vector unit (its
/// transform_row_elements per cycle, else its F32 lane width): the layout planner's and the
/// simulator's one cost.
double transform_seconds(const Device& dev, double elements);

}  // namespace hanpu
