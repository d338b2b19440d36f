// `hanpu chat`: an interactive conversation with a checkpoint (issue 35 item 2). Each turn renders
// the whole conversation with the checkpoint's chat template (the same rendering as `hanpu run
// --chat` and `hanpu serve`; ChatML where the family registry allows it as the fallback), and
// generates through the one Generator (hanpu/generator.hpp: its stop ids, sampling and chunked
// prefill). The conversation's HybridState is kept between turns, so a turn prefills only the
// tokens the state has not seen:
//   - the state has seen the previous prompt and the reply's tokens fed back to the model;
//   - the new rendering's tokens are compared with those; where they agree to the end, the state
//     goes on from there (the reply is reused too);
//   - where the template renders earlier turns differently from what the model saw (Qwen3.5's
//     template drops an earlier turn's <think> block, Kimi's renders it empty; a reply whose tokens
//     are not the tokenizer's own encoding of its text), a recurrent state cannot be rolled back:
//     the turn restores the deepest of two snapshots the previous turn kept (at the end of the
//     conversation without the generation prompt, and at the end of the prompt) that lies within
//     the common prefix, or starts from an empty state, and prefills the rest.
// Every reply is thus the one a fresh prefill of the same rendering gives (tests/test_chat_cli.cpp
// checks it against the Generator from scratch).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/weight_args.hpp"
#include "cpu/thread_pool.hpp"
#include "hanpu/chat_output.hpp"
#include "hanpu/chat_template.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/generator.hpp"
#include "hanpu/model.hpp"
#include "hanpu/model_family.hpp"
#include "hanpu/tokenizer.hpp"
#include "model/gguf_arch.hpp"

namespace {

using namespace hanpu;
using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct ChatArgs {
  std::string model_dir, system, precision = "exact", template_kwargs;
  int n_predict = 512;
  int threads = 0;
  float temperature = 0.7f, top_p = 0.95f;
  int top_k = 20;
  uint64_t seed = 0;
  bool greedy = false, think = false, json = false;
  WeightArgs weights;
};

// How the conversation becomes text: the checkpoint's template, or ChatML where the family's
// registry row names it as the fallback (the same choice `hanpu serve` makes).
class ChatRenderer {
 public:
  ChatRenderer(const std::string& model_dir, const HybridModel& model, const Tokenizer& tok) : tok_(tok) {
    tmpl_ = load_chat_template(model_dir);  // a template outside hanpu's Jinja subset: an error naming the construct
    if (tmpl_) {
      special_tokens_ = chat_template_special_tokens(model_dir);
      description_ = "the checkpoint's (" + tmpl_->origin() + ")";
      splits_reasoning_ = tmpl_->source().find("</think>") != std::string::npos;
      reads_thinking_ = tmpl_->source().find("enable_thinking") != std::string::npos;
      return;
    }
    const ModelFamily* family = find_model_family(model.config().model_type);
    if (family && family->chat_template.empty())
      throw Error("checkpoint '" + model_dir + "' has no chat template (chat_template.jinja or tokenizer_config.json "
                  "chat_template), and " + family->name + " checkpoints have no fallback template: they ship their own");
    if (family && family->chat_template != "chatml")
      throw Error("checkpoint '" + model_dir + "' has no chat template, and the " + family->name + " fallback template \"" +
                  family->chat_template + "\" is not one hanpu has");
    if (!tok.token_to_id("<|im_start|>") || !tok.token_to_id("<|im_end|>"))
      throw Error("checkpoint '" + model_dir + "' has no chat template, and its tokenizer lacks ChatML's <|im_start|> "
                  "and <|im_end|> for the fallback");
    description_ = "ChatML (the checkpoint has no chat template; " + (family ? family->name + "'s" : std::string("the")) +
                   " fallback)";
    splits_reasoning_ = reads_thinking_ = true;  // Qwen's ChatML writes <think> blocks
  }

  /// --chat-template-kwargs: extra template variables. The ChatML fallback reads enable_thinking only.
  void set_kwargs(const ojson& kwargs) {
    for (const auto& [key, value] : kwargs.items()) {
      if (key == "messages" || key == "tools" || key == "add_generation_prompt" || key == "documents")
        throw Error("--chat-template-kwargs: key '" + key + "' is set by hanpu chat itself, expected other variables");
      if (key == "enable_thinking" && !value.is_boolean())
        throw Error("--chat-template-kwargs: 'enable_thinking' must be true or false, got " + value.dump());
      if (!tmpl_ && key != "enable_thinking")
        throw Error("--chat-template-kwargs: key '" + key + "': the ChatML fallback (no chat template in the checkpoint) "
                    "reads only enable_thinking");
    }
    kwargs_ = kwargs;
  }

  /// The conversation as text: messages are {"role", "content"} objects, an assistant's with
  /// "reasoning_content" when its reply had a <think> block.
  std::string render(const ojson& messages, bool add_generation_prompt, bool thinking) const {
    if (!tmpl_) {
      std::vector<ChatMessage> msgs;
      for (const ojson& m : messages) {
        std::string content = m["content"].get<std::string>();
        // Qwen's ChatML takes an assistant's reasoning from a "<think>...</think>" prefix.
        if (m.contains("reasoning_content"))
          content = "<think>\n" + m["reasoning_content"].get<std::string>() + "\n</think>\n\n" + content;
        msgs.push_back({m["role"].get<std::string>(), content});
      }
      return tok_.apply_chat_template(msgs, add_generation_prompt, thinking);
    }
    // As render_chat_prompt (hanpu/chat_template.hpp) does for `hanpu run --chat`: the special
    // tokens and enable_thinking as variables, then the user's kwargs.
    ojson kwargs = special_tokens_.is_object() ? special_tokens_ : ojson::object();
    kwargs["enable_thinking"] = thinking;
    for (const auto& [key, value] : kwargs_.items())
      if (key != "enable_thinking") kwargs[key] = value;
    return tmpl_->render(messages, nullptr, add_generation_prompt, kwargs);
  }

  const std::string& description() const { return description_; }
  bool splits_reasoning() const { return splits_reasoning_; }
  bool reads_thinking() const { return reads_thinking_; }

 private:
  const Tokenizer& tok_;
  std::unique_ptr<ChatTemplate> tmpl_;
  ojson special_tokens_ = ojson::object(), kwargs_ = ojson::object();
  std::string description_;
  bool splits_reasoning_ = false, reads_thinking_ = false;
};

// The reply on stdout as it comes: the answer plainly, the reasoning dimmed on a terminal, or
// with each line prefixed by "> " when stdout is not one (a pipe, a file).
class ReplyPrinter {
 public:
  explicit ReplyPrinter(bool terminal) : terminal_(terminal) {}
  void reasoning(const std::string& s) {
    if (s.empty()) return;
    if (terminal_) {
      std::cout << "\033[2m" << s << "\033[0m";
    } else {
      for (char c : s) {
        if (line_start_) std::cout << "> ";
        std::cout << c;
        line_start_ = c == '\n';
      }
    }
    in_reasoning_ = true;
    std::cout.flush();
  }
  void content(const std::string& s) {
    if (s.empty()) return;
    if (in_reasoning_ && !line_start_) std::cout << '\n';  // the answer starts on a line of its own
    in_reasoning_ = false;
    line_start_ = s.back() == '\n';
    std::cout << s;
    std::cout.flush();
  }
  void end() {
    std::cout << '\n';
    std::cout.flush();
    line_start_ = true;
    in_reasoning_ = false;
  }

 private:
  bool terminal_, line_start_ = true, in_reasoning_ = false;
};

// A state the conversation can go back to, with the tokens it has seen.
struct Snapshot {
  const char* name;
  HybridState state;
};

class ChatSession {
 public:
  ChatSession(const HybridModel& model, const Tokenizer& tok, const ChatRenderer& renderer, GenerationOptions go,
              ForwardOptions fo, bool json, bool terminal_out)
      : model_(model), tok_(tok), renderer_(renderer), gen_(model, &tok), go_(std::move(go)), fo_(fo), json_(json),
        terminal_out_(terminal_out), state_(model.new_state()) {}

  void set_system(std::string text) { system_ = std::move(text); }
  void set_thinking(bool on) { thinking_ = on; }
  bool thinking() const { return thinking_; }
  void reset() {
    messages_ = ojson::array();
    state_ = model_.new_state();
    seen_.clear();
    snapshots_.clear();
    turn_ = 0;
    state_touched_ = false;
  }

  /// One turn: the user's message, the streamed reply, the status line. After an error the
  /// conversation is as before the message (the state starts over if it was touched).
  void turn(const std::string& user_text) {
    try {
      turn_or_throw(user_text);
    } catch (...) {
      if (state_touched_) {
        state_touched_ = false;
        state_ = model_.new_state();
        seen_.clear();
        snapshots_.clear();
      }
      throw;
    }
  }

 private:
  void turn_or_throw(const std::string& user_text) {
    ojson messages = conversation();
    messages.push_back({{"role", "user"}, {"content", user_text}});
    const std::string text = renderer_.render(messages, true, thinking_);
    const std::vector<int32_t> prompt = tok_.encode(text, /*parse_special=*/true);
    if (prompt.empty()) throw Error("the rendered conversation encodes to no tokens");
    for (int32_t id : prompt)
      if (id >= model_.config().vocab_size)
        throw Error("the rendered conversation has token id " + std::to_string(id) + ", outside the model's vocabulary of " +
                    std::to_string(model_.config().vocab_size) + " (a tokenizer that does not belong to this checkpoint?)");
    const int64_t n = static_cast<int64_t>(prompt.size());

    // Where to go on from: the live state when the new rendering agrees with all it has seen,
    // else the deepest snapshot within the common prefix, else an empty state. The last prompt
    // token always runs (its logits choose the first reply token).
    const size_t shared = common_prefix(prompt, seen_);
    const int64_t usable = std::min<int64_t>(static_cast<int64_t>(shared), n - 1);
    state_touched_ = true;  // from here on state_ and seen_ may disagree until the turn completes
    std::string from = "live state";
    if (state_.position > usable) {
      const Snapshot* best = nullptr;
      for (const Snapshot& s : snapshots_)
        if (s.state.position <= usable && (!best || s.state.position > best->state.position)) best = &s;
      if (best) {
        state_ = best->state;
        from = best->name;
      } else {
        state_ = model_.new_state();
        from = "none";
      }
    } else if (state_.position == 0) {
      from = "none";
    }
    const int64_t reused = state_.position;

    // Snapshots for the next turn: at the end of this conversation without the generation prompt
    // (where a template that re-renders the reply differently diverges at the latest, e.g.
    // Qwen3.5's dropping its <think> block), and at the end of the prompt.
    std::vector<int64_t> checkpoints;
    if (auto h = history_snapshot_length([&] { return renderer_.render(messages, false, thinking_); }, tok_, prompt);
        h && *h > reused)
      checkpoints.push_back(*h);
    // And where the next turn will diverge, when the template renders this turn anew then.
    const std::optional<int64_t> divergence = next_turn_divergence_length(
        [&] { return renderer_.render(with_placeholder_next_turn(messages), false, thinking_); }, tok_, prompt);
    if (divergence && *divergence > reused) checkpoints.push_back(*divergence);
    checkpoints.push_back(n);
    std::sort(checkpoints.begin(), checkpoints.end());  // the prefill walks them in order
    checkpoints.erase(std::unique(checkpoints.begin(), checkpoints.end()), checkpoints.end());
    std::vector<Snapshot> next_snapshots;
    ForwardOptions one = fo_;
    one.all_logits = false;
    const auto t0 = Clock::now();
    const Tensor logits = gen_.prefill(state_, prompt, n, Generator::kDefaultPrefillChunk, one, checkpoints,
                                       [&](const HybridState& s) {
                                         next_snapshots.push_back({s.position == n                              ? "prompt-end snapshot"
                                                                  : s.position == divergence ? "next-turn divergence snapshot"
                                                                                             : "history snapshot",
                                                                  s});
                                       });
    const double prefill_s = seconds_since(t0);

    // Reasoning is shown apart from the answer when the template writes <think> blocks; the
    // prompt may end inside one (thinking on).
    const bool split = renderer_.splits_reasoning();
    const size_t open = text.rfind("<think>"), close = text.rfind("</think>");
    const bool opened = split && open != std::string::npos && (close == std::string::npos || close < open);
    ReasoningStream reasoning_stream(opened);
    ReplyPrinter printer(terminal_out_);
    auto show = [&](const ReasoningSplit& d) {
      printer.reasoning(d.reasoning);
      printer.content(d.content);
    };
    const size_t V = static_cast<size_t>(model_.config().vocab_size);
    const Generator::Result r = gen_.decode(
        state_, {logits.ptr<float>() + (logits.shape()[0] - 1) * static_cast<int64_t>(V), V}, go_, fo_, [&](int32_t id) {
          if (tok_.is_special(id)) return;
          const std::string piece = tok_.token_bytes(id);
          if (split) show(reasoning_stream.push(piece));
          else printer.content(piece);
        });
    if (split) show(reasoning_stream.finish());
    printer.end();

    // The reply as the template expects it back (as `hanpu serve` returns it): reasoning_content
    // apart, without the newlines around it, and the answer without its leading newlines.
    ojson reply = {{"role", "assistant"}};
    std::string content = r.text;
    if (split) {
      const ReasoningSplit sp = split_reasoning(r.text, opened);
      std::string reasoning = sp.reasoning;
      while (!reasoning.empty() && reasoning.front() == '\n') reasoning.erase(0, 1);
      while (!reasoning.empty() && reasoning.back() == '\n') reasoning.pop_back();
      content = sp.content;
      while (!content.empty() && content.front() == '\n') content.erase(0, 1);
      reply["content"] = content;
      if (!reasoning.empty() || r.text.find("</think>") != std::string::npos || opened) reply["reasoning_content"] = reasoning;
    } else {
      reply["content"] = content;
    }
    // Kept as generated, bytes that are not UTF-8 included (a reply cut inside a character): the
    // next rendering then encodes to the tokens the model saw. (The server's client gets U+FFFD.)
    messages_.push_back(messages.back());
    messages_.push_back(reply);

    // What the state has seen: the prompt and the reply tokens fed back (not the last one when
    // the reply ended by length, nor a stop token).
    const int64_t fed = state_.position - n;
    if (fed < 0 || fed > static_cast<int64_t>(r.tokens.size()))
      throw Error("hanpu chat: the state is at position " + std::to_string(state_.position) + " after a " +
                  std::to_string(n) + "-token prompt and " + std::to_string(r.tokens.size()) + " reply tokens");
    seen_ = prompt;
    seen_.insert(seen_.end(), r.tokens.begin(), r.tokens.begin() + fed);
    snapshots_ = std::move(next_snapshots);
    state_touched_ = false;
    ++turn_;

    const double ttft = prefill_s + r.first_token_seconds;
    const size_t generated = r.tokens.size();
    const double decode_rate = generated > 1 && r.decode_seconds > 0 ? static_cast<double>(generated - 1) / r.decode_seconds : 0.0;
    const char* finish = r.reason == FinishReason::kStopToken ? "stop" : r.reason == FinishReason::kStopString ? "stop string" : "length";
    if (json_) {
      ojson status = {{"turn", turn_},
                      {"prompt_tokens", n},
                      {"reused_tokens", reused},
                      {"prefilled_tokens", n - reused},
                      {"reused_from", from},
                      {"common_prefix_tokens", shared},
                      {"time_to_first_token_s", ttft},
                      {"prefill_tokens_per_s", prefill_s > 0 ? static_cast<double>(n - reused) / prefill_s : 0.0},
                      {"generated_tokens", generated},
                      {"decode_tokens_per_s", decode_rate},
                      {"finish_reason", finish},
                      {"reply_ids", r.tokens},
                      {"message", reply}};
      std::cerr << status.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    } else {
      std::fprintf(stderr,
                   "[turn %d: prompt %lld tokens, %lld reused (%s), %lld prefilled; first token %.3f s; %zu tokens, "
                   "%.2f tokens/s; %s]\n",
                   turn_, static_cast<long long>(n), static_cast<long long>(reused), from.c_str(),
                   static_cast<long long>(n - reused), ttft, generated, decode_rate, finish);
    }
  }

  ojson conversation() const {
    ojson m = ojson::array();
    if (!system_.empty()) m.push_back({{"role", "system"}, {"content", system_}});
    for (const ojson& x : messages_) m.push_back(x);
    return m;
  }

  const HybridModel& model_;
  const Tokenizer& tok_;
  const ChatRenderer& renderer_;
  const Generator gen_;
  const GenerationOptions go_;
  const ForwardOptions fo_;
  const bool json_, terminal_out_;
  std::string system_;
  bool thinking_ = false;
  ojson messages_ = ojson::array();  // user and assistant messages (the system message apart)
  HybridState state_;
  std::vector<int32_t> seen_;        // the tokens state_ has consumed (state_.position of them)
  std::vector<Snapshot> snapshots_;  // the previous turn's
  int turn_ = 0;
  bool state_touched_ = false;
};

constexpr const char* kCommands = "/reset, /system TEXT, /think on|off, /quit";

void run_chat(const ChatArgs& a) {
  const int threads = a.threads > 0 ? a.threads : hardware_threads();
  ojson kwargs = ojson::object();
  if (!a.template_kwargs.empty()) {  // checked before the model loads
    kwargs = ojson::parse(a.template_kwargs, nullptr, false);
    if (kwargs.is_discarded())
      throw Error("--chat-template-kwargs: not valid JSON: '" + a.template_kwargs.substr(0, 80) +
                  "', expected a JSON object such as '{\"enable_thinking\": true}'");
    if (!kwargs.is_object())
      throw Error("--chat-template-kwargs: expected a JSON object such as '{\"enable_thinking\": true}', got " +
                  std::string(kwargs.type_name()));
  }
  const LinearPrecision precision = linear_precision_from_name(a.precision);
  HybridModel model = HybridModel::load(a.model_dir, {.progress = true,
                                                   .weights = a.weights.options(),
                                                   .engine = std::make_shared<Engine>(threads)});
  const std::filesystem::path dir(a.model_dir);
  if (!(std::filesystem::exists(dir / "tokenizer.json") || std::filesystem::exists(dir / "tiktoken.model") ||
        (model::is_gguf_path(a.model_dir) && model::gguf_has_tokenizer(a.model_dir))))
    throw Error("checkpoint '" + a.model_dir + "' has no tokenizer (tokenizer.json or tiktoken.model): hanpu chat needs text");
  const Tokenizer tok = Tokenizer::from_dir(a.model_dir);
  ChatRenderer renderer(a.model_dir, model, tok);
  renderer.set_kwargs(kwargs);
  bool thinking = a.think;
  if (kwargs.contains("enable_thinking")) {
    if (a.think && !kwargs["enable_thinking"].get<bool>())
      throw Error("--think and --chat-template-kwargs '{\"enable_thinking\": false}' contradict each other; give one");
    thinking = kwargs["enable_thinking"].get<bool>();
  }

  GenerationOptions go;
  go.sampling = {.temperature = a.greedy ? 0.f : a.temperature, .top_k = a.top_k, .top_p = a.top_p, .seed = a.seed};
  go.max_tokens = a.n_predict;
  const bool terminal_in = ::isatty(STDIN_FILENO) != 0, terminal_out = ::isatty(STDOUT_FILENO) != 0;
  ChatSession session(model, tok, renderer, go, {.threads = threads, .precision = precision}, a.json, terminal_out);
  session.set_system(a.system);
  session.set_thinking(thinking);
  std::fprintf(stderr, "hanpu chat: %s, chat template %s; thinking %s; %d threads. Commands: %s (EOF ends).\n",
               model.config().describe().c_str(), renderer.description().c_str(), thinking ? "on" : "off", threads, kCommands);

  // On a terminal a mistake is reported and the conversation goes on; from a pipe or file it ends
  // the run with exit code 1, so a script's error does not pass unnoticed.
  auto fail = [&](const std::string& message) {
    if (!terminal_in) throw Error(message);
    std::fprintf(stderr, "hanpu chat: error: %s\n", message.c_str());
  };
  std::string line;
  while (true) {
    if (terminal_in) {
      std::cout << (terminal_out ? "\033[1m> \033[0m" : "> ");
      std::cout.flush();
    }
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (line[0] == '/' && line.rfind("//", 0) != 0) {
      const size_t space = line.find(' ');
      const std::string cmd = line.substr(0, space);
      std::string arg = space == std::string::npos ? "" : line.substr(space + 1);
      arg.erase(0, std::min(arg.find_first_not_of(' '), arg.size()));
      while (!arg.empty() && arg.back() == ' ') arg.pop_back();
      if (cmd == "/quit" || cmd == "/exit") break;
      if (cmd == "/reset") {
        session.reset();
        std::fprintf(stderr, "[new conversation]\n");
      } else if (cmd == "/system") {
        session.set_system(arg);
        std::fputs(arg.empty() ? "[no system message]\n" : "[system message set]\n", stderr);
      } else if (cmd == "/think") {
        if (arg != "on" && arg != "off") {
          fail("/think: '" + arg + "', expected on or off");
          continue;
        }
        session.set_thinking(arg == "on");
        std::fprintf(stderr, "[thinking %s%s]\n", arg.c_str(),
                     renderer.reads_thinking() ? "" : "; this chat template does not read enable_thinking, so it changes nothing");
      } else {
        fail("unknown command '" + cmd + "', expected one of " + kCommands + " (a message starting with '/' is written '//...')");
      }
      continue;
    }
    const std::string message = line.rfind("//", 0) == 0 ? line.substr(1) : line;
    try {
      session.turn(message);
    } catch (const Error& e) {
      fail(e.what());
    }
  }
}

}  // namespace

void register_chat_command(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* c = app.add_subcommand(
      "chat",
      "an interactive conversation with a checkpoint: one user message per input line, the checkpoint's chat template, "
      "the model's state kept between turns so each turn prefills only its new tokens (commands: /reset, /system TEXT, "
      "/think on|off, /quit)");
  c->add_option("--model", a->model_dir, "checkpoint directory (with tokenizer.json or tiktoken.model) or GGUF file")->required();
  c->add_option("--system", a->system, "system message (also /system TEXT)");
  c->add_flag("--think", a->think, "let the model think (chat_template_kwargs enable_thinking; also /think on|off)");
  c->add_option("--chat-template-kwargs", a->template_kwargs,
                "extra chat template variables as a JSON object, e.g. '{\"enable_thinking\": true}'");
  c->add_option("-n,--n-predict,--max-tokens", a->n_predict, "tokens per reply at most (default 512)")->check(CLI::Range(0, 1 << 30));
  c->add_option("--threads", a->threads, "threads (default all)")->check(CLI::Range(1, 1024));
  c->add_option("--temp", a->temperature, "sampling temperature (default 0.7; 0 = greedy)")->check(CLI::Range(0.0, 100.0));
  c->add_option("--top-k", a->top_k, "keep the k most likely tokens (default 20, 0 = all)")->check(CLI::Range(0, 1 << 30));
  c->add_option("--top-p", a->top_p, "nucleus sampling threshold (default 0.95)")->check(CLI::Range(0.0, 1.0));
  c->add_option("--seed", a->seed, "sampling seed of every reply (default 0)");
  c->add_flag("--greedy", a->greedy, "always take the most likely token");
  c->add_option("--precision", a->precision, "projection activations: exact (f32, default), bf16x2, bf16, int8 (int8 weights only)");
  a->weights.add_to(c);
  c->add_flag("--json", a->json, "per-turn status as one JSON object per line on stderr (with the reply's token ids and message)");
  c->callback([a] { run_chat(*a); });
}
