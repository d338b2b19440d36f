// The GGUF reader (src/io/gguf.cpp) on fixtures written by gguf-py's GGUFWriter
// (tools/make_gguf_fixtures.py -> tests/data/gguf) and on hand-corrupted copies of them: each
// rejection must be a hanpu::Error naming the file, the key or tensor, and what was wrong.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hanpu/gguf_format.hpp"
#include "io/gguf.hpp"
#include "test_support.hpp"

namespace {

using hanpu::GgufFile;
using hanpu::GgufModel;
using hanpu::GgufType;
using hanpu::GgufValue;
using hanpu::testing::TempDir;
using json = nlohmann::json;
using Bytes = std::vector<uint8_t>;

std::filesystem::path data_dir() { return hanpu::testing::golden_dir().parent_path() / "data" / "gguf"; }
std::string fixture(const std::string& name) { return (data_dir() / name).string(); }

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
json read_json(const std::string& path) { return json::parse(hanpu::testing::read_text(path)); }

// Offset of the first occurrence of `s` in `b` (the test fails if absent).
size_t find(const Bytes& b, const std::string& s) {
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  EXPECT_NE(it, b.end()) << "'" << s << "' not in the fixture";
  return static_cast<size_t>(it - b.begin());
}
template <class T>
void put(Bytes& b, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}
template <class T>
T get(const Bytes& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}
// Where a key's value type field is (the key's text is preceded by its u64 length).
size_t key_type_at(const Bytes& b, const std::string& key) { return find(b, key) + key.size(); }
// Where a tensor info's n_dims field is.
size_t tensor_info_at(const Bytes& b, const std::string& name) { return find(b, name) + name.size(); }

// Opens the corrupted bytes as a file and expects a hanpu::Error whose message names the file and
// contains every fragment.
void expect_rejected(const Bytes& b, const std::vector<std::string>& fragments, const std::string& name = "bad.gguf") {
  TempDir tmp("hanpu_gguf");
  const std::string path = tmp.file(name);
  write_bytes(path, b);
  try {
    GgufFile::open(path);
    ADD_FAILURE() << "accepted; expected an error containing '" << fragments.front() << "'";
  } catch (const hanpu::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

void expect_value(const GgufValue& v, const json& want, const std::string& key) {
  SCOPED_TRACE(key);
  const std::string type = want["type"];
  ASSERT_EQ(hanpu::gguf_type_name(v.type), type);
  const json& w = want["value"];
  if (type == "array") {
    EXPECT_EQ(hanpu::gguf_type_name(v.elem_type), want["elem_type"].get<std::string>());
    const auto& items = std::get<std::vector<GgufValue>>(v.value);
    ASSERT_EQ(items.size(), w.size());
    for (size_t i = 0; i < items.size(); ++i) expect_value(items[i], w[i], key + "[" + std::to_string(i) + "]");
  } else if (type == "string") {
    EXPECT_EQ(std::get<std::string>(v.value), w.get<std::string>());
  } else if (type == "bool") {
    EXPECT_EQ(std::get<bool>(v.value), w.get<bool>());
  } else if (type == "f32" || type == "f64") {
    EXPECT_EQ(std::get<double>(v.value), w.get<double>());
  } else if (type[0] == 'u') {
    EXPECT_EQ(std::get<uint64_t>(v.value), w.get<uint64_t>());
  } else {
    EXPECT_EQ(std::get<int64_t>(v.value), w.get<int64_t>());
  }
}

// Every key, tensor and dequantized value of a fixture as gguf-py wrote and decoded it.
void expect_matches(const GgufModel& m, const json& want) {
  size_t n_keys = 0;
  for (const GgufFile& f : m.files()) {
    for (const auto& [key, v] : f.metadata()) {
      if (key.rfind("split.", 0) == 0) continue;  // added by the writer per part
      ASSERT_TRUE(want["metadata"].contains(key)) << key;
      expect_value(v, want["metadata"][key], key);
      ++n_keys;
    }
  }
  EXPECT_EQ(n_keys, want["metadata"].size());
  ASSERT_EQ(m.tensor_count(), want["tensors"].size());
  for (const json& wt : want["tensors"]) {
    const std::string name = wt["name"];
    SCOPED_TRACE(name);
    const hanpu::GgufTensorInfo& t = m.tensor(name);
    EXPECT_EQ(hanpu::gguf::ggml_type_name(static_cast<uint32_t>(t.type)), wt["type"].get<std::string>());
    ASSERT_EQ(t.n_dims, static_cast<int>(wt["dims"].size()));
    for (int d = 0; d < t.n_dims; ++d) EXPECT_EQ(t.dims[d], wt["dims"][d].get<int64_t>());
    const auto& bits = wt["values_f32_bits"];
    ASSERT_EQ(t.numel(), static_cast<int64_t>(bits.size()));
    std::vector<float> got(static_cast<size_t>(t.numel()));
    hanpu::gguf::dequantize(t.type, t.data, got.data(), t.numel());
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t g;
      std::memcpy(&g, &got[i], 4);
      ASSERT_EQ(g, bits[i].get<uint32_t>()) << "element " << i;
    }
  }
}

TEST(Gguf, ReadsWhatGgufPyWrote) {
  const GgufModel m = GgufModel::open(fixture("tiny.gguf"));
  ASSERT_EQ(m.files().size(), 1u);
  EXPECT_EQ(m.main().version(), 3u);
  EXPECT_EQ(m.main().alignment(), 32u);
  EXPECT_EQ(m.main().get_string("general.architecture"), "hanpu-test");
  EXPECT_EQ(m.main().get_uint("test.u16"), 60000u);
  expect_matches(m, read_json(fixture("tiny.expected.json")));
  for (const auto& t : m.main().tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;
  }
}

TEST(Gguf, CustomAlignment) {
  const GgufModel m = GgufModel::open(fixture("aligned64.gguf"));
  EXPECT_EQ(m.main().alignment(), 64u);
  EXPECT_EQ(m.main().data_offset() % 64, 0u);
  expect_matches(m, read_json(fixture("aligned64.expected.json")));
  EXPECT_EQ(m.tensor("a").n_dims, 3);
}

TEST(Gguf, SplitModelFromAnyPart) {
  const json want = read_json(fixture("split.expected.json"));
  for (int part = 1; part <= 3; ++part) {
    const GgufModel m = GgufModel::open(fixture(hanpu::gguf_split_path("split", part, 3)));
    ASSERT_EQ(m.files().size(), 3u);
    EXPECT_EQ(m.main().path(), fixture("split-00001-of-00003.gguf"));
    expect_matches(m, want);
  }
}

TEST(Gguf, SplitNames) {
  const auto s = hanpu::parse_gguf_split_name("/a/b/Model-Q4_K-00002-of-00010.gguf");
  EXPECT_EQ(s.prefix, "/a/b/Model-Q4_K");
  EXPECT_EQ(s.no, 2);
  EXPECT_EQ(s.count, 10);
  EXPECT_EQ(hanpu::parse_gguf_split_name("model.gguf").count, 0);
  EXPECT_EQ(hanpu::parse_gguf_split_name("m-0001-of-00010.gguf").count, 0);
  EXPECT_EQ(hanpu::parse_gguf_split_name("m-00001-0f-00010.gguf").count, 0);
  EXPECT_EQ(hanpu::gguf_split_path("x", 3, 12), "x-00003-of-00012.gguf");
}

TEST(Gguf, AccessorErrorsNameKeyAndType) {
  const GgufFile f = GgufFile::open(fixture("tiny.gguf"));
  EXPECT_THROW(f.get_uint("test.string"), hanpu::Error);
  EXPECT_THROW(f.get_uint("test.i8"), hanpu::Error);  // negative
  EXPECT_THROW(f.get_string("test.u8"), hanpu::Error);
  EXPECT_THROW(f.get_float("no.such.key"), hanpu::Error);
  EXPECT_THROW(f.tensor("no.such.tensor"), hanpu::Error);
  try {
    f.get_uint("test.string");
  } catch (const hanpu::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tiny.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find("key 'test.string' is string"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected a non-negative integer"), std::string::npos) << msg;
  }
}

// --- rejections ------------------------------------------------------------------------------------

class GgufRejects : public ::testing::Test {
 protected:
  Bytes tiny = read_bytes(fixture("tiny.gguf"));
};

TEST_F(GgufRejects, MagicAndVersion) {
  Bytes b = tiny;
  b[0] = 'X';
  expect_rejected(b, {"magic", "'XGUF'", "expected 'GGUF'"});
  for (uint32_t v : {0u, 1u, 4u}) {
    b = tiny;
    put<uint32_t>(b, 4, v);
    expect_rejected(b, {"version " + std::to_string(v), "expected 2 or 3"});
  }
  b = tiny;
  put<uint32_t>(b, 4, 3u << 24);
  expect_rejected(b, {"big-endian"});
  expect_rejected(Bytes{'G', 'G', 'U'}, {"3 bytes", "magic"});
  expect_rejected(Bytes{}, {"0 bytes"});
}

TEST_F(GgufRejects, Counts) {
  Bytes b = tiny;
  put<uint64_t>(b, 8, uint64_t{1} << 60);
  expect_rejected(b, {"tensor count 1152921504606846976", "cannot fit"});
  b = tiny;
  put<uint64_t>(b, 16, ~uint64_t{0});
  expect_rejected(b, {"metadata count", "cannot fit"});
  b = tiny;
  put<uint64_t>(b, 16, get<uint64_t>(tiny, 16) + 1);  // one more key than written: reads tensor info as a key
  expect_rejected(b, {});
}

TEST_F(GgufRejects, Strings) {
  Bytes b = tiny;
  put<uint64_t>(b, find(b, "test.u8") - 8, uint64_t{1} << 40);
  expect_rejected(b, {"metadata key #1 length 1099511627776", "above the limit"});
  b = tiny;
  const size_t s = find(b, "llo\tgguf") - 8 - 3;  // "h\u00e9llo\tgguf": h + 2 bytes of UTF-8
  put<uint64_t>(b, s, 100000);
  expect_rejected(b, {"truncated", "value of key 'test.string'", "100000 bytes"});
  b = tiny;
  put<uint64_t>(b, find(b, "f32.weight") - 8, 0);
  expect_rejected(b, {"empty name"});
}

TEST_F(GgufRejects, ValueTypes) {
  Bytes b = tiny;
  put<uint32_t>(b, key_type_at(b, "test.u8"), 13);
  expect_rejected(b, {"key 'test.u8'", "value type 13", "expected 0..12"});
  b = tiny;
  b[key_type_at(b, "test.bool") + 4] = 2;
  expect_rejected(b, {"key 'test.bool'", "bool value is 2"});
  b = tiny;
  put<uint32_t>(b, key_type_at(b, "test.array_i32") + 4, 99);
  expect_rejected(b, {"key 'test.array_i32'", "array element type 99"});
  b = tiny;
  put<uint64_t>(b, key_type_at(b, "test.array_i32") + 8, uint64_t{1} << 50);
  expect_rejected(b, {"key 'test.array_i32'", "array of 1125899906842624 i32", "cannot fit"});
  b = tiny;
  b[find(b, "test.i8") + 5] = 'u';  // "test.i8" -> "test.u8": a duplicate key
  expect_rejected(b, {"key 'test.u8' appears twice"});
}

TEST_F(GgufRejects, NestedArraysDepthIsBounded) {
  // A hand-built file: one key holding arrays nested 5 deep (1 element each) around an i32.
  Bytes b;
  auto u32 = [&](uint32_t v) { b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4); };
  auto u64 = [&](uint64_t v) { b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 8); };
  auto build = [&](int depth) {
    b.clear();
    u32(0x46554747); u32(3); u64(0); u64(1);
    u64(4); b.insert(b.end(), {'d', 'e', 'e', 'p'});
    u32(9);
    for (int d = 1; d < depth; ++d) { u32(9); u64(1); }
    u32(5); u64(1); u32(7);
  };
  build(4);
  {
    TempDir tmp("hanpu_gguf");
    write_bytes(tmp.file("ok.gguf"), b);
    const GgufFile f = GgufFile::open(tmp.file("ok.gguf"));
    const GgufValue* v = f.find("deep");
    ASSERT_NE(v, nullptr);
    for (int d = 0; d < 4; ++d) v = &std::get<std::vector<GgufValue>>(v->value).at(0);
    EXPECT_EQ(std::get<int64_t>(v->value), 7);
  }
  build(5);
  expect_rejected(b, {"key 'deep'", "nested deeper than 4"});
}

TEST_F(GgufRejects, Alignment) {
  const Bytes a64 = read_bytes(fixture("aligned64.gguf"));
  for (uint32_t v : {0u, 48u}) {
    Bytes b = a64;
    put<uint32_t>(b, key_type_at(b, "general.alignment") + 4, v);
    expect_rejected(b, {"key 'general.alignment' is " + std::to_string(v), "power of two"});
  }
  Bytes b = a64;
  put<uint32_t>(b, key_type_at(b, "general.alignment"), 5);  // i32 64
  expect_rejected(b, {"key 'general.alignment' is i32 64", "expected a u32"});
}

TEST_F(GgufRejects, TensorInfo) {
  Bytes b = tiny;
  put<uint32_t>(b, tensor_info_at(b, "f32.weight"), 5);
  expect_rejected(b, {"tensor 'f32.weight'", "n_dims is 5", "expected 1..4"});
  b = tiny;
  put<uint32_t>(b, tensor_info_at(b, "f32.weight"), 0);
  expect_rejected(b, {"tensor 'f32.weight'", "n_dims is 0"});
  // q8_0.weight: n_dims 2, dims [64, 3], type, offset
  const size_t q8 = tensor_info_at(tiny, "q8_0.weight");
  b = tiny;
  put<uint32_t>(b, q8 + 4 + 16, 4);  // type code 4 (retired Q4_2)
  expect_rejected(b, {"tensor 'q8_0.weight'", "GGML type code 4 is not a known type"});
  b = tiny;
  put<uint32_t>(b, q8 + 4 + 16, 1000);
  expect_rejected(b, {"tensor 'q8_0.weight'", "GGML type code 1000"});
  b = tiny;
  put<uint64_t>(b, q8 + 4, 48);
  expect_rejected(b, {"tensor 'q8_0.weight'", "dims[0] = 48 is not a multiple of Q8_0's block of 32"});
  b = tiny;
  put<uint64_t>(b, q8 + 4 + 8, uint64_t{1} << 62);
  expect_rejected(b, {"tensor 'q8_0.weight'", "dims [64, 4611686018427387904] are too large"});
  b = tiny;
  put<uint64_t>(b, q8 + 4 + 8, ~uint64_t{0});
  expect_rejected(b, {"tensor 'q8_0.weight'", "above 2^63-1"});
  b = tiny;
  put<uint64_t>(b, q8 + 4 + 8, 1000);  // 1000 rows do not fit
  expect_rejected(b, {"tensor 'q8_0.weight'", "go beyond the data section"});
  b = tiny;
  put<uint64_t>(b, q8 + 4 + 16 + 4, get<uint64_t>(tiny, q8 + 4 + 16 + 4) + 1);
  expect_rejected(b, {"tensor 'q8_0.weight'", "not a multiple of the alignment 32"});
  b = tiny;
  put<uint64_t>(b, q8 + 4 + 16 + 4, uint64_t{1} << 62);
  expect_rejected(b, {"tensor 'q8_0.weight'", "go beyond the data section"});
  b = tiny;  // q4_0.weight placed on top of q8_0.weight
  put<uint64_t>(b, tensor_info_at(b, "q4_0.weight") + 4 + 16 + 4, get<uint64_t>(tiny, q8 + 4 + 16 + 4));
  expect_rejected(b, {"tensors 'q8_0.weight'", "'q4_0.weight'", "overlap"});
  b = tiny;
  b[find(b, "q4_0.weight") + 1] = '8';  // a second "q8_0.weight"
  expect_rejected(b, {"tensor 'q8_0.weight' appears twice"});
}

TEST_F(GgufRejects, EveryTruncation) {
  // Every prefix of the file must be refused (or, past the last tensor's bytes, accepted) without
  // a crash; with sanitizers this is the check that no read goes past the buffer.
  const uint64_t last_byte = [&] {
    const GgufFile f = hanpu::parse_gguf("tiny.gguf", reinterpret_cast<const std::byte*>(tiny.data()), tiny.size());
    uint64_t end = 0;
    for (const auto& t : f.tensors()) end = std::max(end, f.data_offset() + t.offset + t.bytes);
    return end;
  }();
  int rejected = 0;
  for (size_t n = 0; n < tiny.size(); ++n) {
    std::vector<std::byte> prefix(n);  // its own allocation, so ASan sees reads past n
    if (n) std::memcpy(prefix.data(), tiny.data(), n);
    try {
      hanpu::parse_gguf("tiny.gguf", prefix.data(), n);
      EXPECT_GE(n, last_byte) << "a prefix of " << n << " bytes was accepted";
    } catch (const hanpu::Error& e) {
      EXPECT_LT(n, last_byte);
      EXPECT_NE(std::string(e.what()).find("tiny.gguf"), std::string::npos);
      ++rejected;
    }
  }
  EXPECT_EQ(static_cast<uint64_t>(rejected), last_byte);
}

TEST_F(GgufRejects, RandomByteFlipsNeverCrash) {
  std::mt19937 rng(34);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> b(tiny.size());
    std::memcpy(b.data(), tiny.data(), tiny.size());
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k)
      b[rng() % 1120] = static_cast<std::byte>(rng());  // inside the header
    try {
      hanpu::parse_gguf("flip.gguf", b.data(), b.size());
      ++accepted;
    } catch (const hanpu::Error&) {
    }
  }
  EXPECT_GT(accepted, 0);  // flips inside values are legal files
}

TEST_F(GgufRejects, Splits) {
  TempDir tmp("hanpu_gguf");
  std::vector<Bytes> parts;
  for (int i = 1; i <= 3; ++i) parts.push_back(read_bytes(fixture(hanpu::gguf_split_path("split", i, 3))));
  auto write_set = [&](const std::vector<Bytes>& ps, const std::string& prefix) {
    for (size_t i = 0; i < ps.size(); ++i)
      if (!ps[i].empty()) write_bytes(hanpu::gguf_split_path(tmp.file(prefix), static_cast<int>(i + 1), 3), ps[i]);
    return hanpu::gguf_split_path(tmp.file(prefix), 1, 3);
  };
  auto expect_split_error = [&](const std::vector<Bytes>& ps, const std::string& prefix,
                                const std::vector<std::string>& fragments) {
    const std::string first = write_set(ps, prefix);
    try {
      GgufModel::open(first);
      ADD_FAILURE() << prefix << ": accepted";
    } catch (const hanpu::Error& e) {
      for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  };
  std::vector<Bytes> ps = parts;
  ps[2].clear();
  expect_split_error(ps, "missing", {"missing-00003-of-00003.gguf", "No such file"});
  ps = parts;
  put<uint16_t>(ps[1], key_type_at(ps[1], "split.no") + 4, 2);
  expect_split_error(ps, "no", {"no-00002-of-00003.gguf", "key 'split.no' is 2, expected 1"});
  ps = parts;
  put<int32_t>(ps[0], key_type_at(ps[0], "split.tensors.count") + 4, 4);
  expect_split_error(ps, "count", {"count-00001-of-00003.gguf", "'split.tensors.count' is 4", "hold 3 tensors"});
  ps = parts;
  put<uint16_t>(ps[2], key_type_at(ps[2], "split.count") + 4, 4);
  expect_split_error(ps, "scount", {"scount-00003-of-00003.gguf", "key 'split.count' is 4, expected 3"});
  ps = parts;
  ps[1] = parts[0];  // the same tensor twice (and split.no wrong): split.no is checked first
  expect_split_error(ps, "dup", {"dup-00002-of-00003.gguf", "split.no"});
  // a part with split keys under a plain name
  write_bytes(tmp.file("plain.gguf"), parts[0]);
  try {
    GgufModel::open(tmp.file("plain.gguf"));
    ADD_FAILURE() << "accepted";
  } catch (const hanpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'split.count' is 3 but the file name is not of the form"), std::string::npos)
        << e.what();
  }
}

TEST(Gguf, MissingFileAndDirectory) {
  TempDir tmp("hanpu_gguf");
  EXPECT_THROW(GgufFile::open(tmp.file("none.gguf")), hanpu::Error);
  EXPECT_THROW(GgufFile::open(tmp.path().string()), hanpu::Error);
}

}  // namespace
