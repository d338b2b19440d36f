// `hanpu chat` end to end (issue 35 item 2), driven by piped input on the tiny goldens of two
// families, Qwen3.5 (tests/golden/qwen35_tiny) and Kimi Linear (tests/golden/kimi_linear_tiny with
// the Qwen golden's tokenizer.json: the Kimi golden has none, and the Kimi tiktoken fixture's
// 3,000 ids do not fit its 320-token vocabulary):
//   - each reply is the one the Generator gives from an empty state on the whole conversation's
//     rendering (greedy), and the first is `hanpu run --chat`'s: the state kept between turns
//     gives the same tokens as a fresh prefill;
//   - turns 2 and 3 prefill only the tokens the state has not seen: with a template that renders
//     the reply as the model saw it, everything before the new message is reused; with one that
//     re-renders it (Qwen's ChatML drops the empty <think> block, Kimi's empties the reasoning),
//     the turn resumes from the snapshot the previous turn kept where the renderings part;
//   - /reset starts over; bad input (an unknown command, bad --chat-template-kwargs, /think
//     without on|off, a checkpoint without a template whose family has no fallback) is an error
//     naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "hanpu/chat_output.hpp"
#include "hanpu/chat_template.hpp"
#include "hanpu/generator.hpp"
#include "hanpu/model.hpp"
#include "hanpu/tokenizer.hpp"
#include "test_support.hpp"

#ifndef HANPU_EXE
#error "HANPU_EXE must be defined to the path of the hanpu executable"
#endif

namespace {

namespace fs = std::filesystem;
using hanpu::testing::CommandResult;
using hanpu::testing::TempDir;
using ojson = nlohmann::ordered_json;

std::string quote(const std::string& s) { return hanpu::testing::shell_quote(s); }

// A plain ChatML template as Qwen2.5-style checkpoints ship it: an assistant turn is rendered
// exactly as the generation prompt began it, so a conversation's state can go on after the reply.
constexpr const char* kPlainChatMl =
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

fs::path corpus_template(const char* name) {
  return hanpu::testing::golden_dir().parent_path() / "fuzz" / "corpus" / "chat_template" / name;
}

// A copy of a golden checkpoint with the Qwen golden's tokenizer and, if given, a chat_template.jinja.
// `name`: the copy's directory under tmp (default: the golden's name).
std::string checkpoint(const TempDir& tmp, const char* golden, const std::string& chat_template = "", std::string name = "") {
  const fs::path src = hanpu::testing::golden_dir() / golden, qwen = hanpu::testing::golden_dir() / "qwen35_tiny";
  const fs::path dst = tmp.path() / (name.empty() ? std::string(golden) : name);
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename() != "expected.safetensors") fs::copy_file(e.path(), dst / e.path().filename());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (!fs::exists(dst / f)) fs::copy_file(qwen / f, dst / f);
  if (!chat_template.empty()) std::ofstream(dst / "chat_template.jinja", std::ios::binary) << chat_template;
  return dst.string();
}

struct Chat {
  CommandResult result;
  std::vector<ojson> turns;  // the --json status lines
};

Chat chat(const TempDir& tmp, const std::string& model, const std::string& input, const std::string& extra = "",
          int n = 12) {
  Chat c;
  c.result = hanpu::testing::run_command(
      tmp, quote(HANPU_EXE) + " chat --model " + quote(model) + " --greedy --threads 2 --json -n " + std::to_string(n) + " " + extra,
      &input);
  std::istringstream err(c.result.err);
  for (std::string line; std::getline(err, line);)
    if (line.rfind("{\"turn\"", 0) == 0) c.turns.push_back(ojson::parse(line));
  return c;
}

std::vector<int32_t> ids_of(const ojson& j) { return j.get<std::vector<int32_t>>(); }

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

// The conversation rendered from scratch, as the checkpoint's template (or the ChatML fallback)
// renders it, with the assistant messages `hanpu chat` reports it stored.
struct Reference {
  hanpu::HybridModel model;
  hanpu::Tokenizer tok;
  std::unique_ptr<hanpu::ChatTemplate> tmpl;
  ojson kwargs;

  Reference(const std::string& dir, const ojson& extra_kwargs)
      : model(hanpu::HybridModel::load(dir)), tok(hanpu::Tokenizer::from_dir(dir)), tmpl(hanpu::load_chat_template(dir)) {
    kwargs = hanpu::chat_template_special_tokens(dir);
    kwargs["enable_thinking"] = false;
    for (const auto& [k, v] : extra_kwargs.items()) kwargs[k] = v;
  }
  std::string render_text(const ojson& messages, bool generation_prompt) const {
    if (tmpl) return tmpl->render(messages, nullptr, generation_prompt, kwargs);
    std::vector<hanpu::ChatMessage> msgs;
    for (const ojson& m : messages) {
      std::string content = m["content"].get<std::string>();
      if (m.contains("reasoning_content"))
        content = "<think>\n" + m["reasoning_content"].get<std::string>() + "\n</think>\n\n" + content;
      msgs.push_back({m["role"].get<std::string>(), content});
    }
    return tok.apply_chat_template(msgs, generation_prompt, kwargs["enable_thinking"].get<bool>());
  }
  std::vector<int32_t> render(const ojson& messages, bool generation_prompt) const {
    return tok.encode(render_text(messages, generation_prompt), true);
  }
  // The assistant message a reply is stored as (docs/SERVE.md, "hanpu chat"): with a template
  // that writes <think> blocks (the ChatML fallback does), the reasoning apart without the
  // newlines around it and the answer without its leading newlines; the bytes as generated.
  ojson reply_message(const std::vector<int32_t>& reply, const std::string& prompt_text) const {
    std::string text;
    for (int32_t id : reply)
      if (!tok.is_special(id)) text += tok.token_bytes(id);
    const bool split = !tmpl || tmpl->source().find("</think>") != std::string::npos;
    if (!split) return {{"role", "assistant"}, {"content", text}};
    const size_t open = prompt_text.rfind("<think>"), close = prompt_text.rfind("</think>");
    const bool opened = open != std::string::npos && (close == std::string::npos || close < open);
    const hanpu::ReasoningSplit sp = hanpu::split_reasoning(text, opened);
    std::string reasoning = sp.reasoning, content = sp.content;
    while (!reasoning.empty() && reasoning.front() == '\n') reasoning.erase(0, 1);
    while (!reasoning.empty() && reasoning.back() == '\n') reasoning.pop_back();
    while (!content.empty() && content.front() == '\n') content.erase(0, 1);
    ojson m = {{"role", "assistant"}, {"content", content}};
    if (!reasoning.empty() || text.find("</think>") != std::string::npos || opened) m["reasoning_content"] = reasoning;
    return m;
  }
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int n) const {
    const hanpu::Generator gen(model, &tok);
    hanpu::GenerationOptions go;
    go.sampling = {.temperature = 0};
    go.max_tokens = n;
    hanpu::HybridState st = model.new_state();
    return gen.generate(st, prompt, go, {.threads = 2}, hanpu::Generator::kDefaultPrefillChunk).tokens;
  }
};

// Checks every turn of a piped conversation against the fresh-prefill reference, and the reuse
// numbers: `expect_from[k]` names where turn k+1 must resume ("live state" = everything before
// the new message's tokens is reused).
void check_conversation(const std::string& dir, const std::vector<std::string>& users, const Chat& c,
                        const std::vector<std::string>& expect_from, const ojson& extra_kwargs = ojson::object(),
                        const std::string& system = "", int n = 12) {
  ASSERT_EQ(c.result.code, 0) << c.result.err;
  ASSERT_EQ(c.turns.size(), users.size()) << c.result.err;
  const Reference ref(dir, extra_kwargs);
  ojson messages = ojson::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  std::vector<int32_t> seen, prev_prompt;
  int64_t prev_history = -1, prev_divergence = -1;
  for (size_t k = 0; k < users.size(); ++k) {
    SCOPED_TRACE("turn " + std::to_string(k + 1));
    const ojson& t = c.turns[k];
    messages.push_back({{"role", "user"}, {"content", users[k]}});
    const std::string prompt_text = ref.render_text(messages, true);
    const std::vector<int32_t> prompt = ref.tok.encode(prompt_text, true);
    const int64_t n_prompt = static_cast<int64_t>(prompt.size());
    EXPECT_EQ(t["turn"], k + 1);
    EXPECT_EQ(t["prompt_tokens"], n_prompt);
    // (a) the reply a fresh prefill of the whole rendering gives
    const std::vector<int32_t> reply = ids_of(t["reply_ids"]);
    EXPECT_EQ(reply, ref.generate(prompt, n));
    EXPECT_FALSE(reply.empty());
    // (b) what was reused, and that only the rest was prefilled
    const int64_t reused = t["reused_tokens"].get<int64_t>();
    EXPECT_EQ(t["prefilled_tokens"].get<int64_t>(), n_prompt - reused);
    EXPECT_EQ(t["common_prefix_tokens"].get<size_t>(), common_prefix(prompt, seen));
    if (k == 0) {
      EXPECT_EQ(reused, 0);
      EXPECT_EQ(t["reused_from"], "none");
    } else {
      EXPECT_EQ(t["reused_from"], expect_from[k - 1]);
      if (expect_from[k - 1] == "live state") {
        // every token of the previous prompt and reply the model was fed: all before the new message
        EXPECT_EQ(reused, static_cast<int64_t>(seen.size()));
        EXPECT_GT(reused, static_cast<int64_t>(prev_prompt.size()));
      } else if (expect_from[k - 1] == "prompt-end snapshot") {
        EXPECT_EQ(reused, static_cast<int64_t>(prev_prompt.size()));
      } else if (expect_from[k - 1] == "history snapshot") {
        EXPECT_EQ(reused, prev_history);
        EXPECT_GT(reused, 0);
      } else if (expect_from[k - 1] == "next-turn divergence snapshot") {
        EXPECT_EQ(reused, prev_divergence);
        EXPECT_GT(reused, prev_history);
      } else if (expect_from[k - 1] == "none") {
        EXPECT_EQ(reused, 0);
      }
      // Never more than the renderings share, and never less than the deepest usable state.
      const int64_t usable = std::min<int64_t>(static_cast<int64_t>(common_prefix(prompt, seen)), n_prompt - 1);
      EXPECT_LE(reused, usable);
      int64_t best = static_cast<int64_t>(seen.size()) <= usable ? static_cast<int64_t>(seen.size()) : 0;
      for (int64_t s : {prev_history, prev_divergence, static_cast<int64_t>(prev_prompt.size())})
        if (s >= 0 && s <= usable) best = std::max(best, s);
      EXPECT_EQ(reused, best);
    }
    // The reply as stored, for the next rendering; what the state has seen after this turn.
    const ojson stored = ref.reply_message(reply, prompt_text);
    // --json shows it with bytes that are not UTF-8 as U+FFFD
    EXPECT_EQ(t["message"], ojson::parse(stored.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
    messages.push_back(stored);
    const std::string finish = t["finish_reason"];
    const size_t fed = finish == "stop" ? reply.size() : reply.size() - 1;
    seen = prompt;
    seen.insert(seen.end(), reply.begin(), reply.begin() + static_cast<std::ptrdiff_t>(fed));
    prev_prompt = prompt;
    ojson history = messages;
    history.erase(history.size() - 1);
    // The previous turn keeps a snapshot there if it is a part of its prompt it prefilled.
    const std::vector<int32_t> h = ref.render(history, false);
    const bool kept = h.size() < prompt.size() && static_cast<int64_t>(h.size()) > reused &&
                      std::equal(h.begin(), h.end(), prompt.begin());
    prev_history = kept ? static_cast<int64_t>(h.size()) : -1;
    // And one where the next turn's rendering leaves this prompt (the conversation continued by
    // any reply and user message), if that is inside it.
    ojson continued = history;
    continued.push_back({{"role", "assistant"}, {"content", "reply"}});
    continued.push_back({{"role", "user"}, {"content", "next"}});
    const int64_t d = static_cast<int64_t>(common_prefix(prompt, ref.render(continued, false)));
    prev_divergence = d > 0 && d < n_prompt && d > reused ? d : -1;
  }
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

const std::vector<std::string> kUsers = {"Hello there", "What is the weather like today?", "Tell me more"};

// Qwen3.5 (GDN, gated attention), Kimi Linear (KDA, MLA) and Ling 3.0 (KDA, MLA with RoPE).
class ChatFamilies : public ::testing::TestWithParam<const char*> {};

TEST_P(ChatFamilies, PlainChatMlReusesTheWholeConversation) {
  // 16-token replies: these goldens' replies then hold no special token. (A special token is
  // left out of the reply's text, as the server leaves it out, so the next rendering differs
  // from what the model saw there: with 12 tokens Kimi's second reply has <|im_start|> and its
  // third turn resumes from the prompt-end snapshot, which check_conversation's rule covers.)
  TempDir tmp;
  const std::string dir = checkpoint(tmp, GetParam(), kPlainChatMl);
  const Chat c = chat(tmp, dir, join_lines(kUsers), "", 16);
  check_conversation(dir, kUsers, c, {"live state", "live state"}, ojson::object(), "", 16);
}

INSTANTIATE_TEST_SUITE_P(Goldens, ChatFamilies, ::testing::Values("qwen35_tiny", "kimi_linear_tiny", "bailing_hybrid_tiny"));

TEST(ChatCli, QwenFallbackTemplateResumesWhereTheRenderingsPart) {
  // No template in the checkpoint: Qwen's ChatML (the family's fallback), which renders an earlier
  // reply without the empty <think> block its generation prompt had: the next turn resumes where
  // the renderings part, after the previous reply's "<|im_start|>assistant\n" (10 tokens deeper
  // than the history snapshot at the end of the previous conversation without its generation
  // prompt).
  TempDir tmp;
  const std::string dir = checkpoint(tmp, "qwen35_tiny");
  const std::string system = "You are terse.";
  const Chat c = chat(tmp, dir, join_lines(kUsers), "--system " + quote(system));
  check_conversation(dir, kUsers, c, {"next-turn divergence snapshot", "next-turn divergence snapshot"}, ojson::object(),
                     system);

  // Thinking on: the prompt ends inside "<think>\n", the replies are reasoning, and the next
  // rendering shows an earlier turn's answer alone: again where the renderings part.
  const Chat t = chat(tmp, dir, join_lines(kUsers), "--think");
  check_conversation(dir, kUsers, t, {"next-turn divergence snapshot", "next-turn divergence snapshot"},
                     {{"enable_thinking", true}});
  for (const ojson& turn : t.turns) EXPECT_TRUE(turn["message"].contains("reasoning_content")) << turn.dump();

  // The first turn is `hanpu run --chat`'s reply.
  const CommandResult run = hanpu::testing::run_command(
      tmp, quote(HANPU_EXE) + " run --model " + quote(dir) + " --chat --greedy --ids -n 12 --threads 2 --system " +
               quote(system) + " --prompt " + quote(kUsers[0]));
  ASSERT_EQ(run.code, 0) << run.err;
  std::istringstream out(run.out);
  std::vector<int32_t> run_ids;
  for (int32_t id; out >> id;) run_ids.push_back(id);
  ASSERT_FALSE(c.turns.empty());
  EXPECT_EQ(ids_of(c.turns[0]["reply_ids"]), run_ids);
}

TEST(ChatCli, KimiTemplateWithAndWithoutThinking) {
  TempDir tmp;
  const std::string dir = checkpoint(tmp, "kimi_linear_tiny", hanpu::testing::read_text(corpus_template("kimi_like.jinja").string()));
  {
    // thinking false: the reply is rendered back as the model saw it
    SCOPED_TRACE("thinking false");
    const ojson kwargs = {{"thinking", false}};
    const Chat c = chat(tmp, dir, join_lines(kUsers), "--chat-template-kwargs " + quote(kwargs.dump()));
    check_conversation(dir, kUsers, c, {"live state", "live state"}, kwargs);
  }
  {
    // thinking (the default): the prompt ends in "<think>", the reply is reasoning, and the next
    // rendering shows it as an empty "<think></think>": the turn resumes at the previous prompt's end.
    SCOPED_TRACE("thinking");
    const Chat c = chat(tmp, dir, join_lines(kUsers));
    check_conversation(dir, kUsers, c, {"prompt-end snapshot", "prompt-end snapshot"});
    for (const ojson& t : c.turns) EXPECT_TRUE(t["message"].contains("reasoning_content")) << t.dump();
  }
}

TEST(ChatCli, ResetStartsOver) {
  TempDir tmp;
  const std::string dir = checkpoint(tmp, "qwen35_tiny", kPlainChatMl);
  const Chat c = chat(tmp, dir, "Hello there\nAgain\n/reset\nHello there\n");
  ASSERT_EQ(c.result.code, 0) << c.result.err;
  ASSERT_EQ(c.turns.size(), 3u);
  EXPECT_NE(c.result.err.find("[new conversation]"), std::string::npos);
  EXPECT_EQ(c.turns[2]["turn"], 1);
  EXPECT_EQ(c.turns[2]["reused_tokens"], 0);
  EXPECT_EQ(c.turns[2]["reused_from"], "none");
  EXPECT_EQ(c.turns[2]["prompt_tokens"], c.turns[0]["prompt_tokens"]);
  EXPECT_EQ(c.turns[2]["reply_ids"], c.turns[0]["reply_ids"]);
  // /system changes the first message: nothing after it can be reused, and the reply is the fresh one.
  const Chat s = chat(tmp, dir, "Hello there\n/system Be brief.\nHello there\n/quit\nnot read\n");
  ASSERT_EQ(s.result.code, 0) << s.result.err;
  ASSERT_EQ(s.turns.size(), 2u);
  EXPECT_EQ(s.turns[1]["reused_tokens"], 0);
  EXPECT_EQ(s.turns[1]["reused_from"], "none");
  const Reference ref(dir, ojson::object());
  const ojson msgs = {{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Hello there"}},
                      ref.reply_message(ids_of(s.turns[0]["reply_ids"]), ""),
                      {{"role", "user"}, {"content", "Hello there"}}};
  EXPECT_EQ(ids_of(s.turns[1]["reply_ids"]), ref.generate(ref.render(msgs, true), 12));
}

TEST(ChatCli, BadInputIsAnErrorNamingIt) {
  TempDir tmp;
  const std::string dir = checkpoint(tmp, "qwen35_tiny", kPlainChatMl);
  struct Case {
    std::string input, extra, expect;
  } cases[] = {
      {"Hello\n/frobnicate now\n", "", "unknown command '/frobnicate'"},
      {"/think maybe\n", "", "/think: 'maybe', expected on or off"},
      {"Hello\n", "--chat-template-kwargs '{bad'", "--chat-template-kwargs: not valid JSON: '{bad'"},
      {"Hello\n", "--chat-template-kwargs '[1]'", "--chat-template-kwargs: expected a JSON object"},
      {"Hello\n", "--chat-template-kwargs '{\"messages\": []}'", "key 'messages' is set by hanpu chat itself"},
      {"Hello\n", "--chat-template-kwargs '{\"enable_thinking\": 1}'", "'enable_thinking' must be true or false, got 1"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.input + " " + k.extra);
    const Chat c = chat(tmp, dir, k.input, k.extra, 2);
    EXPECT_EQ(c.result.code, 1) << c.result.err;
    EXPECT_NE(c.result.err.find(k.expect), std::string::npos) << c.result.err;
  }
  // A Kimi checkpoint without a template: Kimi has no fallback, and the error says so.
  const std::string kimi = checkpoint(tmp, "kimi_linear_tiny");
  const Chat k = chat(tmp, kimi, "Hello\n");
  EXPECT_EQ(k.result.code, 1);
  EXPECT_NE(k.result.err.find("Kimi Linear checkpoints have no fallback template"), std::string::npos) << k.result.err;
  // No tokenizer: no text to chat with.
  const Chat bare = chat(tmp, (hanpu::testing::golden_dir() / "bailing_hybrid_tiny").string(), "Hello\n");
  EXPECT_EQ(bare.result.code, 1);
  EXPECT_NE(bare.result.err.find("has no tokenizer (tokenizer.json or tiktoken.model)"), std::string::npos) << bare.result.err;
  // The ChatML fallback reads enable_thinking only.
  const std::string qwen = checkpoint(tmp, "qwen35_tiny", "", "qwen_no_template");
  const Chat q = chat(tmp, qwen, "Hello\n", "--chat-template-kwargs '{\"thinking\": false}'");
  EXPECT_EQ(q.result.code, 1);
  EXPECT_NE(q.result.err.find("key 'thinking': the ChatML fallback"), std::string::npos) << q.result.err;
  // A message starting with '/' is written '//'.
  const Chat slash = chat(tmp, dir, "//etc/hosts\n", "", 2);
  ASSERT_EQ(slash.result.code, 0) << slash.result.err;
  ASSERT_EQ(slash.turns.size(), 1u);
}

}  // namespace
