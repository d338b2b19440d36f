// `hanpu tokenize`: runs the tokenizer of a checkpoint (tokenizer.json, a tiktoken.model next to
// its tokenizer_config.json, or the checkpoint directory) on text
// and prints the ids with the piece each stands for, or decodes ids back to text. With --stats it
// also reports the encode speed (tokens/s), measured over the one call.
#include <CLI/CLI.hpp>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "cli/commands.hpp"
#include "hanpu/chat_template.hpp"
#include "hanpu/tensor.hpp"
#include "hanpu/tokenizer.hpp"

namespace {

using namespace hanpu;

struct TokenizeArgs {
  std::string tokenizer;
  std::string text;
  std::string file;
  std::string decode;  // --decode: comma-separated ids, parsed strictly (CLI11 reads "" as 0)
  bool decode_given = false;
  bool ids_only = false;
  bool chat = false;
  bool think = false;
  bool no_special = false;
  bool stats = false;
  bool text_given = false;  // --text "" is an empty text, not "read stdin"
};

// A piece shown on one line: control bytes, backslash and bytes of incomplete UTF-8 sequences
// escaped, so that every token is visible and the output stays one token per line.
std::string printable(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    char buf[8];
    if (b == '\n') out += "\\n";
    else if (b == '\r') out += "\\r";
    else if (b == '\t') out += "\\t";
    else if (b == '\\') out += "\\\\";
    else if (b < 0x20 || b == 0x7F) std::snprintf(buf, sizeof buf, "\\x%02x", b), out += buf;
    else if (b < 0x80) out += static_cast<char>(b);
    else {
      // Copy a whole well-formed multi-byte character, or escape the stray byte.
      const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 ? 2 : 0;
      bool whole = len != 0 && i + len <= bytes.size();
      for (size_t k = 1; whole && k < len; ++k) whole = (static_cast<uint8_t>(bytes[i + k]) & 0xC0) == 0x80;
      if (whole) out.append(bytes, i, len), i += len - 1;
      else std::snprintf(buf, sizeof buf, "\\x%02x", b), out += buf;
    }
  }
  return out;
}

// "1,2,3" -> ids; every item must be a whole decimal integer (an empty list or item is an error).
std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  for (;;) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw Error("--decode: got \"" + printable(item) + "\" in \"" + printable(s) +
                  "\", expected comma-separated token ids (integers)");
    out.push_back(v);
    if (comma == std::string::npos) return out;
    pos = comma + 1;
  }
}

Tokenizer load(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) return Tokenizer::from_dir(path);
  if (fs::path(path).extension() == ".gguf") return Tokenizer::from_gguf(path);  // its tokenizer.ggml.* keys
  // A tiktoken BPE needs its special tokens, which the tokenizer_config.json beside it names.
  if (fs::path(path).filename() == "tiktoken.model")
    return Tokenizer::from_tiktoken(path, (fs::path(path).parent_path() / "tokenizer_config.json").string());
  return Tokenizer::from_file(path);
}

void run_tokenize(const TokenizeArgs& a) {
  const Tokenizer tok = load(a.tokenizer);
  if (a.decode_given) {
    std::vector<int32_t> ids;
    for (int64_t id : parse_ids(a.decode)) {
      if (id < 0 || id >= tok.vocab_size())
        throw Error("--decode: token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                    std::to_string(tok.vocab_size() - 1) + ")");
      ids.push_back(static_cast<int32_t>(id));
    }
    std::cout << tok.decode(ids) << std::endl;
    return;
  }
  std::string text = a.text;
  if (!a.file.empty()) {
    std::ifstream in(a.file, std::ios::binary);
    if (!in) throw Error(a.file + ": cannot open the --file input");
    text.assign(std::istreambuf_iterator<char>(in), {});
  } else if (!a.text_given) {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});  // neither --text nor --file: stdin
  }
  if (a.chat) {  // the checkpoint's chat template when it has one, else ChatML
    namespace fs = std::filesystem;
    const std::string dir = fs::is_directory(a.tokenizer) ? a.tokenizer : fs::path(a.tokenizer).parent_path().string();
    const std::unique_ptr<ChatTemplate> tmpl = load_chat_template(dir.empty() ? "." : dir);
    text = render_chat_prompt(tmpl.get(), chat_template_special_tokens(dir.empty() ? "." : dir), tok, {{"user", text}}, true, a.think);
  }

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(text, !a.no_special);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (a.ids_only) {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << '\n';
  } else {
    for (int32_t id : ids) std::cout << id << '\t' << printable(tok.token_bytes(id)) << '\n';
  }
  if (a.stats)
    std::fprintf(stderr, "%zu tokens from %zu bytes in %.3f ms (%.0f tokens/s, %.1f MB/s)\n", ids.size(), text.size(),
                 seconds * 1e3, seconds > 0 ? static_cast<double>(ids.size()) / seconds : 0.0,
                 seconds > 0 ? static_cast<double>(text.size()) / seconds / 1e6 : 0.0);
}

}  // namespace

void register_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand("tokenize", "encode text with a checkpoint's tokenizer (or --decode ids)");
  sub->add_option("--tokenizer", args->tokenizer, "tokenizer.json, tiktoken.model (with tokenizer_config.json beside it), a checkpoint directory or a GGUF file")->required();
  auto* text = sub->add_option("--text", args->text, "the text to encode (default: read stdin)");
  auto* file = sub->add_option("--file", args->file, "encode the contents of this file");
  text->excludes(file);
  sub->add_flag("--ids", args->ids_only, "print only the ids, comma-separated");
  sub->add_flag("--chat", args->chat, "wrap the text as one user message in the chat template beside the tokenizer (ChatML when there is none)");
  sub->add_flag("--think", args->think, "with --chat: open a <think> block (thinking mode) instead of an empty one");
  sub->add_flag("--no-special", args->no_special, "treat special tokens written in the text as plain text");
  sub->add_flag("--stats", args->stats, "report token count and encode speed on stderr");
  sub->add_option("--decode", args->decode, "decode these comma-separated ids instead of encoding")
      ->excludes(text)
      ->excludes(file);
  sub->callback([args, sub] {
    args->text_given = sub->count("--text") > 0;
    args->decode_given = sub->count("--decode") > 0;
    run_tokenize(*args);
  });
}
