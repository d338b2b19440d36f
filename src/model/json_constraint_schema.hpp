// Constrained sampling for JSON that follows a JSON Schema (OpenAI's response_format
// {"type": "json_schema", "json_schema": {"schema": ..., "strict": true}}; issue 35 item 5).
//
// The schema is compiled once per request into a small graph of nodes (object, array, string,
// number, integer, a fixed byte pattern for enum/const/format values, any JSON value, anyOf). A
// generation's state is a set of stacks of frames over that graph (more than one while anyOf
// alternatives share a prefix); each frame feeds on bytes. Values of no fixed shape (strings,
// numbers, "any") reuse the json_object automaton (JsonState, json_constraint.hpp).
//
// The mask walks a byte trie of the vocabulary, built once per tokenizer and shared, so tokens
// that share a prefix share the work and a rejected prefix prunes every token under it. A token
// is allowed if it keeps the document valid and the shortest completion after it (in bytes, one
// single-byte token each) still fits max_tokens.
//
// What is enforced: type (one or a list), properties (written in the schema's order; optional
// ones may be left out, required ones may not), required, additionalProperties (with properties
// or required, no extra keys are ever written, so false/true/a schema all hold; required names
// missing from properties take the additionalProperties schema; an object schema with neither
// and additionalProperties absent or true is any object), enum and const (the value written as compact JSON), items,
// minItems, maxItems, anyOf, allOf with one member, $ref to "#", "#/$defs/..." or
// "#/definitions/...", recursion through $ref, and the string formats date, time, date-time and
// uuid (as fixed patterns: dates up to day 28, times in UTC "Z"; each a subset of RFC 3339's).
// Annotations (title, description, default, examples, ...) and unknown keywords are ignored, as
// validators ignore them. Keywords it cannot enforce are refused with SchemaError naming the
// keyword and where it is (a JSON pointer into the schema): never unconstrained output.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hanpu/tensor.hpp"
#include "json_constraint.hpp"

namespace hanpu {

class Tokenizer;

/// A schema keyword that cannot be enforced or that is malformed.
class SchemaError : public Error {
 public:
  SchemaError(std::string pointer, std::string keyword, const std::string& what)
      : Error("schema " + (pointer.empty() ? std::string("root") : "'" + pointer + "'") + ", keyword '" + keyword +
              "': " + what),
        pointer_(std::move(pointer)), keyword_(std::move(keyword)) {}
  /// JSON pointer of the schema object holding the keyword ("" at the root).
  const std::string& pointer() const { return pointer_; }
  const std::string& keyword() const { return keyword_; }

 private:
  std::string pointer_, keyword_;
};

/// A compiled schema: immutable, shared by the generations of one request.
class JsonSchema {
 public:
  /// Throws SchemaError. The root must be an object schema (as OpenAI's strict mode requires):
  /// a document then ends at its closing brace, which ends the generation.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::ordered_json& schema);

  /// Bytes of the shortest document the schema admits (also the fewest tokens it can take).
  int64_t min_bytes() const;

  enum class Kind : uint8_t { kObject, kArray, kString, kNumber, kInteger, kAny, kPattern, kAnyOf };
  struct Property {
    std::string key;  // the name as JSON writes it, without the quotes
    int32_t node = -1;
    bool required = false;
  };
  struct Node {
    Kind kind = Kind::kAny;
    std::vector<Property> properties;  // kObject, in the schema's order
    int32_t items = -1;                // kArray
    int64_t min_items = 0, max_items = -1;  // kArray; -1: no maximum
    std::vector<std::pair<uint8_t, uint8_t>> pattern;  // kPattern: a byte range per position
    std::vector<int32_t> alternatives;  // kAnyOf: as written; flat: the non-anyOf nodes they reach
    std::vector<int32_t> flat;
    bool object_only = false;            // kAny: an object of any keys and values (a free-form object schema)
    int64_t min_bytes = 0;               // the shortest value
    // kObject, for the shortest completion: from property i on, the bytes of the required ones
    // ("key":value each, with a comma before each) and the cheapest single property.
    std::vector<int64_t> required_from, cheapest_from;
    std::vector<int32_t> next_required;  // first required index >= i (size: none)
  };
  std::vector<Node> nodes;
  int32_t root = -1;
};

/// Where a document following a schema is. Copyable; the mask copies it at each trie node.
class SchemaState {
 public:
  explicit SchemaState(const JsonSchema& schema);
  /// A value of the schema's node `node` (any node, not only an object root; the tool-call
  /// grammar starts one per parameter, json_constraint_tools.hpp).
  SchemaState(const JsonSchema& schema, int32_t node);
  /// Feeds one byte; false if no alternative can take it (the state is then unusable).
  bool feed(uint8_t byte);
  bool done() const;
  /// The value may end here: done(), or a top-level number that could also go on (what follows
  /// it is not the value's, so only the byte after it decides).
  bool can_end() const;
  /// Bytes the shortest valid completion needs.
  int64_t closing_cost() const;
  /// One alternative, inside a string between characters: plain content bytes (no quote,
  /// backslash or control byte; whole UTF-8 characters) leave the state as it is.
  bool in_plain_string() const;

  struct Frame {
    int32_t node = -1;
    uint8_t phase = 0;
    int32_t index = 0;   // object: next property allowed / the key matched; pattern: position
    int32_t key_len = 0;  // object: key bytes read; integer: digits read
    int64_t count = 0;   // array: items complete
    JsonState json;      // string, number, integer and any values
  };
  using Stack = std::vector<Frame>;

 private:
  const JsonSchema* schema_;
  std::vector<Stack> stacks_;
};

// A set of tokens as a byte trie, in arrays: node i's children are edges [first_edge[i],
// first_edge[i + 1]), its tokens (those whose bytes end here) [first_token[i], first_token[i + 1]).
struct ByteTrie {
  std::vector<uint32_t> first_edge, first_token;
  std::vector<uint8_t> edge_byte;
  std::vector<uint32_t> edge_node;
  std::vector<int32_t> tokens;
};

/// The vocabulary, preprocessed once per tokenizer (and cached). Inside a string most tokens
/// are plain content (no quote, no backslash, no control byte, whole UTF-8 characters), which
/// leaves the state as it was: those are listed apart and allowed at once there, and only the
/// others are walked (docs/SERVE.md, "JSON Schema", has the measured difference).
struct VocabularyTrie {
  ByteTrie all, not_plain;
  std::vector<int32_t> plain;
  // The plain tokens split by whether they hold a '<': every marker the tool-call grammar keeps
  // out of values starts with one (json_constraint_tools.hpp), so only those need walking there.
  std::vector<int32_t> plain_without_angle;
  ByteTrie plain_with_angle;
  // For raw text (an XML parameter's string value): tokens of whole UTF-8 characters with no
  // '<', no line feed and no control byte but tab and CR leave such a value's state as it is;
  // the rest is walked.
  std::vector<int32_t> text_plain;
  ByteTrie text_rest;
  // Tokens holding a '>': each tool-call opening marker ends with one, so a lazy call's trigger
  // can complete only in such a token (or a special token of the marker).
  std::vector<int32_t> closing_angle;
  std::vector<bool> single_byte = std::vector<bool>(256, false);  // a token of exactly this byte exists
};
std::shared_ptr<const VocabularyTrie> vocabulary_trie(const Tokenizer& tokenizer);

/// Sets the logits of the tokens that cannot continue `state` (feed(byte) -> bool, closing_cost())
/// within `tokens_left` tokens to -infinity: depth first over the trie, a byte the state refuses
/// prunes every token under it. `in_plain_string`: plain content tokens keep the state (and its
/// shortest completion), so they are decided at once and only the other tokens are walked.
/// Marks in `allowed` the tokens of trie `t` that `state` takes within `tokens_left` tokens.
template <class State>
void walk_trie(const ByteTrie& t, const State& state, std::vector<uint8_t>& allowed, int64_t tokens_left) {
  struct Walk {
    const ByteTrie& t;
    std::vector<uint8_t>& allowed;
    int64_t tokens_left;
    void operator()(uint32_t node, const State& from) const {
      for (uint32_t e = t.first_edge[node]; e < t.first_edge[node + 1]; ++e) {
        State next = from;
        if (!next.feed(t.edge_byte[e])) continue;
        const uint32_t child = t.edge_node[e];
        if (t.first_token[child] < t.first_token[child + 1] && next.closing_cost() <= tokens_left - 1)
          for (uint32_t k = t.first_token[child]; k < t.first_token[child + 1]; ++k)
            if (static_cast<size_t>(t.tokens[k]) < allowed.size()) allowed[static_cast<size_t>(t.tokens[k])] = 1;
        (*this)(child, next);
      }
    }
  };
  Walk{t, allowed, tokens_left}(0, state);
}

template <class State>
void mask_with_trie(const VocabularyTrie& vocab, const State& state, bool in_plain_string, std::span<float> logits,
                    int64_t tokens_left) {
  std::vector<uint8_t> allowed(logits.size(), 0);
  if (in_plain_string && state.closing_cost() <= tokens_left - 1)
    for (int32_t id : vocab.plain)
      if (static_cast<size_t>(id) < allowed.size()) allowed[static_cast<size_t>(id)] = 1;
  walk_trie(in_plain_string ? vocab.not_plain : vocab.all, state, allowed, tokens_left);
  for (size_t id = 0; id < logits.size(); ++id)
    if (!allowed[id]) logits[id] = -std::numeric_limits<float>::infinity();
}

/// A key as a JSON Pointer reference token (RFC 6901: "~" as "~0", "/" as "~1"), for error pointers.
std::string escape_pointer_token(const std::string& key);

/// Adds the bytes that closing a document of `schema` within max_tokens may need one token each
/// for: JSON's punctuation, "0", the letters of true/false/null, UTF-8 continuation bytes, and
/// every byte of the schema's keys and the lowest of each pattern range.
void add_closing_bytes(const JsonSchema& schema, std::set<uint8_t>& bytes);

/// The mask for one generation (see the file comment).
class SchemaConstraint {
 public:
  /// Throws hanpu::Error when the vocabulary lacks a single-byte token a completion relies on.
  SchemaConstraint(const Tokenizer& tokenizer, std::shared_ptr<const JsonSchema> schema);
  ~SchemaConstraint();
  void mask(std::span<float> logits, int64_t tokens_left) const;
  bool advance(int32_t token);
  bool done() const { return state_.done(); }

 private:
  const Tokenizer* tokenizer_;
  std::shared_ptr<const VocabularyTrie> trie_;
  std::shared_ptr<const JsonSchema> schema_;
  SchemaState state_;
};

}  // namespace hanpu
