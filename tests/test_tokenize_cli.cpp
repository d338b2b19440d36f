// `hanpu tokenize` end to end on the golden tokenizer: ids, pieces, --chat, --decode, input from
// a file (with invalid UTF-8) and from stdin, a checkpoint directory, and clean one-line errors
// (exit code 1) for a broken tokenizer.json, a missing file and ids outside the vocabulary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_support.hpp"

#ifndef HANPU_EXE
#error "HANPU_EXE must be defined to the path of the hanpu executable"
#endif

namespace {

namespace fs = std::filesystem;
using hanpu::testing::TempDir;

using hanpu::testing::read_text;
using Result = hanpu::testing::CommandResult;
std::string quote(const std::string& s) { return hanpu::testing::shell_quote(s); }

// Runs `hanpu tokenize <args>` (stdin from `input`) and captures its output.
Result tokenize(const TempDir& dir, const std::string& args, const std::string& input = "") {
  return hanpu::testing::run_command(dir, quote(HANPU_EXE) + " tokenize " + args, &input);
}

std::string golden_tokenizer() { return (hanpu::testing::golden_dir() / "tokenizer" / "tokenizer.json").string(); }

TEST(TokenizeCli, IdsPiecesAndDecode) {
  TempDir dir;
  const std::string tok = "--tokenizer " + quote(golden_tokenizer());
  Result r = tokenize(dir, tok + " --text 'Hello world' --ids");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "39,1807,334,1408,551\n");

  r = tokenize(dir, tok + " --text " + quote("Hi\n<|im_end|>"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "39\tH\n72\ti\n198\t\\n\n4002\t<|im_end|>\n");

  r = tokenize(dir, tok + " --decode 39,1807,334,1408,551");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello world\n");

  r = tokenize(dir, tok + " --text 'Hi there' --chat --ids");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, 5), "4001,");  // <|im_start|>

  r = tokenize(dir, tok + " --ids", "Hello world");  // stdin
  EXPECT_EQ(r.out, "39,1807,334,1408,551\n");
  r = tokenize(dir, tok + " --ids --text ''", "not read");  // an empty --text is empty, not stdin
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "\n");
}

TEST(TokenizeCli, FileWithInvalidUtf8AndDirectory) {
  TempDir dir;
  std::ofstream(dir.file("input.txt"), std::ios::binary) << "abc\xff" "def";
  fs::copy_file(golden_tokenizer(), dir.path() / "tokenizer.json");
  const Result r = tokenize(dir, "--tokenizer " + quote(dir.path().string()) + " --file " + quote(dir.file("input.txt")) + " --ids");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "1526,187,314\n");  // tests/golden/tokenizer/expected.json, case invalid_ff
}

TEST(TokenizeCli, ErrorsAreOneLine) {
  TempDir dir;
  std::ofstream(dir.file("broken.json")) << "{\"model\": {\"type\": \"Unigram\"}}";
  Result r = tokenize(dir, "--tokenizer " + quote(dir.file("broken.json")) + " --text x");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("broken.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.type"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  r = tokenize(dir, "--tokenizer " + quote(golden_tokenizer()) + " --file " + quote(dir.file("absent.txt")));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("absent.txt"), std::string::npos) << r.err;

  r = tokenize(dir, "--tokenizer " + quote(golden_tokenizer()) + " --decode 1,99999");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("99999"), std::string::npos) << r.err;
}


TEST(TokenizeCli, KimiTiktokenDirectoryAndModelFile) {
  // The tiktoken golden (tests/data/kimi_tiktoken): a directory with tiktoken.model and no
  // tokenizer.json, or the tiktoken.model file itself, gives tiktoken's ids.
  TempDir dir;
  const fs::path kimi = hanpu::testing::golden_dir().parent_path() / "data" / "kimi_tiktoken";
  std::ifstream in(kimi / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  const nlohmann::json* special = nullptr;
  for (const auto& c : expected.at("cases"))
    if (c.at("name") == "special tokens") special = &c;
  ASSERT_NE(special, nullptr);
  std::string want;
  for (const auto& id : special->at("ids")) want += (want.empty() ? "" : ",") + std::to_string(id.get<int>());
  const std::string text = special->at("text").get<std::string>();
  for (const fs::path& where : {kimi, kimi / "tiktoken.model"}) {
    Result r = tokenize(dir, "--tokenizer " + quote(where.string()) + " --ids", text);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, want + "\n") << where;
    r = tokenize(dir, "--tokenizer " + quote(where.string()) + " --decode " + want);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, text + "\n");
  }
  const Result r = tokenize(dir, "--tokenizer " + quote(kimi.string()) + " --chat --text hi");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("tiktoken tokenizer"), std::string::npos) << r.err;
}

}  // namespace
