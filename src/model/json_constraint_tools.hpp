// Constrained sampling for a whole tool call (issue 35 items 3 and 5): with tool_choice "required"
// or a named function, `hanpu serve` ends the prompt with the start of a call in the template's
// format and this grammar masks every token after it, so the reply is always a call that parses:
// the function's name one of the tools (or the named one), its arguments following the tool's
// `parameters` schema, the closing markers, then the end of the reply.
//
// The formats (hanpu/chat_output.hpp, written from the templates' own renderings of past calls):
//   - kJsonTags (Qwen3-Next, Ling): <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>,
//     ARGS compact JSON following the schema (the json_schema automaton, json_constraint_schema.hpp);
//     parallel calls separated by "\n".
//   - kKimiSections: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//     <|tool_call_argument_begin|>ARGS<|tool_call_end|> ... <|tool_calls_section_end|>, IDX one to
//     six digits (the parser ignores it; Kimi's models write a counter there).
//   - kXmlTags (Qwen3.5): <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n ...
//     </function>\n</tool_call>. Parameters in the schema's property order, required ones present,
//     no others. A parameter whose schema admits only strings (xml_parameter_is_string) is written
//     as the text itself, as the template renders strings: free text (valid UTF-8) for a plain
//     string, one of the values for an enum/const, the format's pattern for date/time/date-time/
//     uuid; every other parameter as compact JSON following its schema (numbers and objects as
//     the template's tojson writes them; booleans and null as JSON's true/false/null, which the
//     parser reads back by the schema, where the template would print Python's True/None).
//
// The whole reply is one byte automaton over a small graph of nodes: choices among fixed texts
// (the markers, the names, the parameter openings), JSON values (a SchemaState of the tool's
// compiled schema), raw string values and digits. Inside values, the format's markers (and <think>,
// </think>, which the reasoning split would cut at) may not appear as text: a string holding
// "</tool_call>" would end the call early. A token is allowed if it keeps the reply valid and the
// shortest completion after it (in bytes, one single-byte token each) still fits max_tokens; a
// special token (a marker the tokenizer has as one) is allowed where the grammar writes exactly its
// text. With parallel calls, the end of each call may be followed by another; there the stop
// tokens are allowed too. Without, the reply ends when the first call closes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hanpu/chat_output.hpp"
#include "hanpu/tensor.hpp"
#include "json_constraint_schema.hpp"

namespace hanpu {

class Tokenizer;

/// A tool's schema or name that the call grammar cannot enforce: which tool (its index in the
/// request's tools), the JSON pointer inside its parameters schema ("" for the root, or for the
/// name) and the keyword ("name" for the tool's name).
class ToolSchemaError : public Error {
 public:
  ToolSchemaError(size_t tool, std::string tool_name, std::string pointer, std::string keyword, const std::string& what)
      : Error(what), tool_(tool), tool_name_(std::move(tool_name)), pointer_(std::move(pointer)), keyword_(std::move(keyword)) {}
  size_t tool() const { return tool_; }
  const std::string& tool_name() const { return tool_name_; }
  const std::string& pointer() const { return pointer_; }
  const std::string& keyword() const { return keyword_; }

 private:
  size_t tool_;
  std::string tool_name_, pointer_, keyword_;
};

/// The XML format writes a parameter as its text when its schema admits only strings: type
/// "string" (or a list of only "string"), an enum or const of strings, a format without a type,
/// anyOf/oneOf whose branches all do, allOf of one that does, $ref to one that does (resolved in
/// `root`, the tool's parameters). Both the grammar and the XML parser (chat_output.cpp) decide
/// by this, so what one writes the other reads back.
bool xml_parameter_is_string(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& root);

/// The grammar of one request's calls (immutable; shared by its choices).
class ToolCallGrammar {
 public:
  struct Tool {
    std::string name;
    nlohmann::ordered_json parameters;  // a JSON Schema; null: no parameters ({} only)
  };
  struct Options {
    ToolCallFormat format = ToolCallFormat::kJsonTags;
    std::vector<Tool> tools;
    std::string forced;     // the named function; empty: any of the tools ("required")
    bool parallel = false;  // more than one call may follow the first
    /// tool_choice "auto" (issue 35): the reply is free until the model writes the format's
    /// opening marker (trigger()); from there the call is constrained as a required one, as
    /// llama.cpp's lazy grammars do. The grammar then starts at the marker and has no prompt prefix.
    bool lazy = false;
  };
  /// Throws ToolSchemaError naming the tool and keyword it cannot enforce (or a bad name).
  static std::shared_ptr<const ToolCallGrammar> compile(const Options& options);

  /// The text the prompt ends with (the start of the first call, up to where the grammar starts).
  const std::string& prompt_prefix() const { return prefix; }
  /// Bytes of the shortest reply (after the prefix) the grammar admits.
  int64_t min_bytes() const;
  /// Options::lazy: the opening marker that starts a call ("<tool_call>", Kimi's
  /// "<|tool_calls_section_begin|>"); empty otherwise.
  const std::string& trigger() const { return trigger_text; }

  enum class Kind : uint8_t { kChoice, kJson, kRaw, kRawPatterns, kDigits };
  struct Option {
    std::string text;
    int32_t next = -1;
  };
  using Pattern = std::vector<std::pair<uint8_t, uint8_t>>;  // a byte range per position
  struct Node {
    Kind kind = Kind::kChoice;
    std::vector<Option> options;   // kChoice, sorted by text (so a typed prefix is a range)
    bool accepting = false;        // kChoice: the reply may end here (no options: it must)
    int32_t tool = -1;             // kJson: whose schema
    int32_t schema_node = -1;      // kJson: the value's node in it
    std::vector<Pattern> patterns;  // kRawPatterns: the raw texts (at most 64)
    int32_t next = -1;             // kJson, kRaw, kRawPatterns, kDigits: the node after (kRaw: a
                                   // choice whose one option starts with the terminator)
    int64_t min_to_end = 0;        // bytes of the shortest way from here to an accepting point
  };
  std::vector<Node> nodes;
  int32_t start = -1;
  std::vector<std::shared_ptr<const JsonSchema>> schemas;  // per tool (null: one the call may not name)
  /// Texts that may not appear inside a value (the format's markers, <think>, </think>), each
  /// with its matcher (a DFA over bytes: state = bytes matched).
  std::vector<std::string> tracked;
  std::vector<std::vector<std::array<uint8_t, 256>>> dfa;
  static constexpr size_t kMaxTracked = 16;
  /// XML: what ends a raw string value ("\n</parameter>"), and its matcher.
  std::string terminator;
  std::vector<std::array<uint8_t, 256>> terminator_dfa;
  std::string prefix;  // prompt_prefix()
  std::string trigger_text;  // trigger()
};

/// Where a reply following the grammar is. Copyable; the mask copies it at each trie node.
class ToolCallState {
 public:
  explicit ToolCallState(const ToolCallGrammar& g);
  /// Feeds one byte; false if the grammar cannot take it (the state is then unusable).
  /// `literal_only`: only a choice's fixed text may take it (a special token's bytes).
  bool feed(uint8_t byte, bool literal_only = false);
  /// The reply may end here.
  bool accepting() const;
  /// Nothing more can follow.
  bool done() const;
  int64_t closing_cost() const;
  /// Inside a JSON value's string between characters with no marker partly matched: a token of
  /// plain string content without '<' leaves the state as it is.
  bool in_plain_string() const;
  /// Inside a raw text value between characters with no marker or terminator partly matched: a
  /// token of VocabularyTrie::text_plain leaves the state as it is.
  bool in_plain_text() const;

 private:
  void enter(int32_t node);
  bool feed_tracked(uint8_t byte);  // false: a marker appeared inside a value
  const ToolCallGrammar* g_;
  int32_t node_ = -1;
  int32_t typed_ = 0;       // kChoice: bytes of the option typed; kDigits: digits; kRawPatterns: position
  int32_t lo_ = 0, hi_ = 0;  // kChoice: the options that match what is typed
  uint64_t alive_ = 0;      // kRawPatterns: the patterns that match so far
  uint8_t utf8_left_ = 0, utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // kRaw
  std::array<uint8_t, ToolCallGrammar::kMaxTracked> match_{};
  uint8_t term_match_ = 0;  // kRaw: bytes of the terminator matched
  std::optional<SchemaState> value_;  // kJson
};

/// The mask for one generation (see the file comment).
class ToolCallConstraint {
 public:
  /// `stop_ids`: the tokens that end the reply, allowed where the grammar may end (none: the
  /// generation ends by itself there). Throws hanpu::Error when the vocabulary lacks a
  /// single-byte token a completion relies on.
  ToolCallConstraint(const Tokenizer& tokenizer, std::shared_ptr<const ToolCallGrammar> grammar,
                     std::vector<int32_t> stop_ids);
  ~ToolCallConstraint();
  void mask(std::span<float> logits, int64_t tokens_left) const;
  /// Advances over the chosen token (not a stop token); false if it was not allowed.
  bool advance(int32_t token);
  /// Advances over bytes (a lazy grammar's trigger and what followed it in the same token);
  /// false, leaving the state as it was, if the grammar cannot take them.
  bool advance_bytes(std::string_view bytes, bool literal_only);
  /// A lazy grammar: whether a reply may go on with `bytes` (starting with the trigger) and still
  /// close within `tokens_left` tokens after the token that carries them.
  static bool opening_fits(const ToolCallGrammar& grammar, std::string_view bytes, bool literal_only, int64_t tokens_left);
  bool accepting() const { return state_.accepting(); }
  bool done() const { return state_.done(); }
  bool may_stop() const { return !stop_ids_.empty(); }

 private:
  const Tokenizer* tokenizer_;
  std::shared_ptr<const VocabularyTrie> trie_;
  std::shared_ptr<const ToolCallGrammar> grammar_;
  std::vector<int32_t> stop_ids_;
  std::vector<std::pair<int32_t, std::string>> specials_;  // special tokens (not stop ids) and their text
  ToolCallState state_;
};

}  // namespace hanpu
