// Safetensors reading/writing (src/io/safetensors.*) and the f16/bf16 scalar conversions
// (src/core/tensor.cpp). Malformed files are hand-built byte by byte so each validation path is
// reached exactly; every error must name the file and, where there is one, the tensor.
#include <gtest/gtest.h>

#include "test_support.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "hanpu/tensor.hpp"
#include "io/safetensors.hpp"

namespace fs = std::filesystem;
using hanpu::DType;
using hanpu::Error;
using hanpu::SafetensorsFile;
using hanpu::Tensor;
using hanpu::TensorView;

using hanpu::testing::TempDir;
using hanpu::testing::golden_dir;

namespace {


void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file with the given header text and `data_bytes` bytes of data (value 0x11).
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  write_bytes(path, le64(header.size()) + header + std::string(data_bytes, '\x11'));
}

// Opens `path`, expecting a hanpu::Error whose message contains every string in `needles`.
void expect_open_error(const std::string& path, const std::vector<std::string>& needles) {
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "expected an error opening " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& needle : needles)
      EXPECT_NE(msg.find(needle), std::string::npos) << "message lacks '" << needle << "': " << msg;
  }
}

// The header of a single F32 tensor 'x' with the given fields pasted in verbatim.
std::string one_entry(const std::string& fields) { return R"({"x": {)" + fields + "}}"; }

}  // namespace

// --- round trips -------------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("all.safetensors");
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> named;
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64};
  for (DType dt : dtypes) {
    Tensor t(dt, {2, 3, 5});
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i * 3 - 20) * (hanpu::is_float(dt) ? 0.25 : 1));
    tensors.push_back(std::move(t));
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    named.emplace_back(std::string("t_") + hanpu::dtype_name(dtypes[i]), tensors[i].view());
  hanpu::write_safetensors(path, named, {{"producer", "test"}, {"note", "äöü"}});

  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata().at("producer"), "test");
  EXPECT_EQ(f.metadata().at("note"), "äöü");
  std::vector<std::string> expected_names;
  for (auto& [name, v] : named) expected_names.push_back(name);
  EXPECT_EQ(f.names(), expected_names);  // data order = write order
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(named[i].first);
    ASSERT_TRUE(f.has(named[i].first));
    const TensorView v = f.get(named[i].first);
    EXPECT_EQ(v.dtype, dtypes[i]);
    EXPECT_EQ(v.shape_str(), "[2,3,5]");
    EXPECT_TRUE(v.is_contiguous());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % hanpu::dtype_size(v.dtype), 0u);
    EXPECT_EQ(std::memcmp(v.data, tensors[i].data(), tensors[i].bytes()), 0);
    const Tensor copy = f.load_copy(named[i].first);
    EXPECT_EQ(copy.shape(), tensors[i].shape());
    EXPECT_EQ(std::memcmp(copy.data(), tensors[i].data(), tensors[i].bytes()), 0);
  }
}

TEST(Safetensors, ScalarsEmptyTensorsAndRankFive) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("shapes.safetensors");
  Tensor scalar(DType::F64, {});
  scalar.set(0, 3.5);
  Tensor empty(DType::F32, {4, 0, 3});
  Tensor rank5(DType::I32, {1, 2, 1, 2, 3});
  for (int64_t i = 0; i < rank5.numel(); ++i) rank5.set(i, static_cast<double>(i));
  hanpu::write_safetensors(path, {{"scalar", scalar.view()}, {"empty", empty.view()}, {"rank5", rank5.view()}});

  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.metadata().empty());
  const TensorView s = f.get("scalar");
  EXPECT_EQ(s.rank, 0);
  EXPECT_EQ(hanpu::load_as_double(s.data, s.dtype, 0), 3.5);
  const TensorView e = f.get("empty");
  EXPECT_FALSE(e.empty()) << "a zero-element tensor is present, not absent";
  EXPECT_EQ(e.shape_str(), "[4,0,3]");
  EXPECT_EQ(e.numel(), 0);
  const TensorView r = f.get("rank5");
  EXPECT_EQ(r.rank, 5);
  for (int64_t i = 0; i < r.numel(); ++i) EXPECT_EQ(hanpu::load_as_double(r.data, r.dtype, i), static_cast<double>(i));
}

TEST(Safetensors, WritesStridedViewsContiguous) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("strided.safetensors");
  Tensor base(DType::F32, {3, 4});
  for (int64_t i = 0; i < 12; ++i) base.set(i, static_cast<double>(i));
  TensorView transposed = base.view();  // [4,3] view of the [3,4] tensor
  transposed.shape = {4, 3};
  transposed.stride = {1, 4};
  TensorView every_other_column = base.view();  // [3,2]: columns 0 and 2
  every_other_column.shape = {3, 2};
  every_other_column.stride = {4, 2};
  hanpu::write_safetensors(path, {{"t", transposed}, {"c", every_other_column}});

  const SafetensorsFile f = SafetensorsFile::open(path);
  const TensorView t = f.get("t");
  ASSERT_EQ(t.shape_str(), "[4,3]");
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(static_cast<const float*>(t.data)[i * 3 + j], static_cast<float>(j * 4 + i));
  const TensorView c = f.get("c");
  ASSERT_EQ(c.shape_str(), "[3,2]");
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_EQ(static_cast<const float*>(c.data)[i * 2 + j], static_cast<float>(i * 4 + 2 * j));

  const Tensor copied = hanpu::copy_to_tensor(transposed);
  EXPECT_EQ(copied.get(1), 4.0);  // row 0 of the transpose is column 0 of base: 0, 4, 8
}

TEST(Safetensors, MisalignedTensorIsCopiedToAlignedStorage) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("misaligned.safetensors");
  // 'pad' is one F16 (2 bytes), so 'x' (F32) starts at data offset 2: not 4-aligned.
  const std::string header =
      R"({"pad":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
      R"("x":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}})";
  std::string data(10, '\0');
  const float values[2] = {1.5f, -7.25f};
  std::memcpy(data.data() + 2, values, 8);
  write_bytes(path, le64(header.size()) + header + data);

  const SafetensorsFile f = SafetensorsFile::open(path);
  const TensorView x = f.get("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data) % alignof(float), 0u);
  EXPECT_EQ(static_cast<const float*>(x.data)[0], 1.5f);
  EXPECT_EQ(static_cast<const float*>(x.data)[1], -7.25f);
}

TEST(Safetensors, HeaderWithoutPaddingOrWithTrailingSpacesIsAccepted) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("spaces.safetensors");
  // 55 header bytes + 3 spaces + 8 puts the data at an odd file offset (66 is not a multiple of
  // 4); the reader must still hand out an aligned view.
  const std::string header = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})" + std::string(3, ' ');
  ASSERT_NE((8 + header.size()) % 4, 0u);
  const float one = 1.0f;
  std::string data(4, '\0');
  std::memcpy(data.data(), &one, 4);
  write_bytes(path, le64(header.size()) + header + data);
  const SafetensorsFile f = SafetensorsFile::open(path);
  const TensorView x = f.get("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data) % alignof(float), 0u);
  EXPECT_EQ(*static_cast<const float*>(x.data), 1.0f);
}

TEST(Safetensors, MissingTensorNamesFileAndTensor) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("small.safetensors");
  Tensor t(DType::F32, {2});
  hanpu::write_safetensors(path, {{"present", t.view()}});
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.has("absent"));
  try {
    f.get("absent");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("absent"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("present"), std::string::npos) << "should list what the file has: " << msg;
  }
}

TEST(Safetensors, WriteRejectsBadRequests) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("bad_write.safetensors");
  Tensor t(DType::F32, {2});
  EXPECT_THROW(hanpu::write_safetensors(path, {{"a", t.view()}, {"a", t.view()}}), Error);
  EXPECT_THROW(hanpu::write_safetensors(path, {{"__metadata__", t.view()}}), Error);
  TensorView null_view = t.view();
  null_view.data = nullptr;
  EXPECT_THROW(hanpu::write_safetensors(path, {{"n", null_view}}), Error);
  EXPECT_THROW(hanpu::write_safetensors(tmp.file("no_such_dir/x.safetensors"), {{"a", t.view()}}), Error);
  EXPECT_FALSE(fs::exists(path));
}

TEST(Safetensors, ReadsPythonWrittenGoldenFile) {
  // Written by tools/make_fla_goldens.py (an independent writer); rewriting and rereading it must
  // preserve every byte of every tensor.
  const fs::path golden = golden_dir() / "gdn_varlen.safetensors";
  ASSERT_TRUE(fs::exists(golden)) << golden << " not found (committed under tests/golden)";
  const SafetensorsFile f = SafetensorsFile::open(golden.string());
  EXPECT_EQ(f.metadata().at("variant"), "gdn");
  const TensorView cu = f.get("cu_seqlens");
  ASSERT_EQ(cu.dtype, DType::I64);
  ASSERT_EQ(cu.shape_str(), "[4]");
  const auto* offsets = static_cast<const int64_t*>(cu.data);
  EXPECT_EQ(offsets[0], 0);
  EXPECT_EQ(offsets[3], f.get("q").shape[1]);  // the sequences tile the packed T axis

  TempDir tmp("hanpu_st");
  const std::string copy_path = tmp.file("copy.safetensors");
  std::vector<std::pair<std::string, TensorView>> all;
  for (const std::string& name : f.names()) all.emplace_back(name, f.get(name));
  hanpu::write_safetensors(copy_path, all, f.metadata());
  const SafetensorsFile copy = SafetensorsFile::open(copy_path);
  EXPECT_EQ(copy.names(), f.names());
  EXPECT_EQ(copy.metadata(), f.metadata());
  for (const std::string& name : f.names()) {
    const TensorView a = f.get(name), b = copy.get(name);
    EXPECT_EQ(a.shape_str(), b.shape_str()) << name;
    EXPECT_EQ(a.dtype, b.dtype) << name;
    EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.numel()) * hanpu::dtype_size(a.dtype)), 0) << name;
  }
}

// --- malformed files ---------------------------------------------------------------------------

TEST(SafetensorsMalformed, MissingFile) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("nope.safetensors");
  expect_open_error(path, {path, "does not exist"});
}

TEST(SafetensorsMalformed, Directory) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("dir.safetensors");
  fs::create_directory(path);
  expect_open_error(path, {path, "directory"});
}

TEST(SafetensorsMalformed, ShorterThanEightBytes) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("short.safetensors");
  write_bytes(path, "abc");
  expect_open_error(path, {path, "3 bytes", "8-byte"});
  write_bytes(path, "");
  expect_open_error(path, {path, "0 bytes"});
}

TEST(SafetensorsMalformed, HeaderLengthBeyondFile) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("hlen.safetensors");
  write_bytes(path, le64(1000) + "{}");
  expect_open_error(path, {path, "header length 1000", "truncated"});
}

TEST(SafetensorsMalformed, HeaderLengthAbsurd) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("huge.safetensors");
  write_bytes(path, le64(0xffffffffffffffffull) + "{}");
  expect_open_error(path, {path, "absurd"});
  write_bytes(path, le64(200ull << 20) + "{}");
  expect_open_error(path, {path, "absurd"});
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("notjson.safetensors");
  write_raw(path, R"({"x": {"dtype": "F32",)", 0);
  expect_open_error(path, {path, "not valid JSON"});
  write_raw(path, std::string("\x89PNG\r\n", 6), 0);
  expect_open_error(path, {path, "not valid JSON"});
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("array.safetensors");
  write_raw(path, "[1, 2, 3]", 0);
  expect_open_error(path, {path, "JSON object", "array"});
  write_raw(path, "42", 0);
  expect_open_error(path, {path, "JSON object"});
}

TEST(SafetensorsMalformed, DeeplyNestedJsonIsRefusedWithoutCrashing) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("deep.safetensors");
  write_raw(path, std::string(1 << 20, '[') + std::string(1 << 20, ']'), 0);
  expect_open_error(path, {path, "nested"});
  // Brackets inside strings do not count.
  write_raw(path, R"({"__metadata__": {"k": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}})", 0);
  EXPECT_EQ(SafetensorsFile::open(path).metadata().at("k"), std::string(40, '['));
}

TEST(SafetensorsMalformed, EntryMissingFields) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("fields.safetensors");
  write_raw(path, one_entry(R"("shape": [1], "data_offsets": [0, 4])"), 4);
  expect_open_error(path, {path, "'x'", "dtype"});
  write_raw(path, one_entry(R"("dtype": "F32", "data_offsets": [0, 4])"), 4);
  expect_open_error(path, {path, "'x'", "shape"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [1])"), 4);
  expect_open_error(path, {path, "'x'", "data_offsets"});
  write_raw(path, R"({"x": [1, 2]})", 4);
  expect_open_error(path, {path, "'x'", "must be an object"});
}

TEST(SafetensorsMalformed, UnsupportedAndUnknownDtypes) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("dtype.safetensors");
  for (const char* dt : {"U8", "I16", "BOOL", "F8_E4M3"}) {
    write_raw(path, one_entry(std::string(R"("dtype": ")") + dt + R"(", "shape": [4], "data_offsets": [0, 4])"), 4);
    expect_open_error(path, {path, "'x'", std::string("'") + dt + "'", "not supported by hanpu"});
  }
  write_raw(path, one_entry(R"("dtype": "F17", "shape": [1], "data_offsets": [0, 4])"), 4);
  expect_open_error(path, {path, "'x'", "'F17'", "not a known dtype"});
  write_raw(path, one_entry(R"("dtype": 32, "shape": [1], "data_offsets": [0, 4])"), 4);
  expect_open_error(path, {path, "'x'", "dtype", "string"});
  write_raw(path, one_entry(R"("dtype": "f32", "shape": [1], "data_offsets": [0, 4])"), 4);
  expect_open_error(path, {path, "'f32'"});  // names are case-sensitive in the format
}

TEST(SafetensorsMalformed, BadShapes) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("shape.safetensors");
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [2, -3], "data_offsets": [0, 0])"), 0);
  expect_open_error(path, {path, "'x'", "negative", "-3"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [2.5], "data_offsets": [0, 4])"), 4);
  expect_open_error(path, {path, "'x'", "not an integer"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": ["2"], "data_offsets": [0, 8])"), 8);
  expect_open_error(path, {path, "'x'", "not an integer"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": 4, "data_offsets": [0, 16])"), 16);
  expect_open_error(path, {path, "'x'", "array"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [1,1,1,1,1,1], "data_offsets": [0, 4])"), 4);
  expect_open_error(path, {path, "'x'", "rank 6"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4])"), 4);
  expect_open_error(path, {path, "'x'", "too large"});
}

TEST(SafetensorsMalformed, ShapeProductOverflowDoesNotWrapToAMatch) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("overflow.safetensors");
  // 2^62 * 4 elements * 4 bytes = 2^66, which wraps to 0 in 64 bits and would "match" [0,0].
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0])"), 0);
  expect_open_error(path, {path, "'x'", "too large"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 0])"), 0);
  expect_open_error(path, {path, "'x'", "too large"});
  // Even with a zero dim the other dims must not overflow numel()'s running product.
  write_raw(path,
            one_entry(R"("dtype": "F32", "shape": [1099511627776, 1099511627776, 0], "data_offsets": [0, 0])"), 0);
  expect_open_error(path, {path, "'x'", "too large"});
}

TEST(SafetensorsMalformed, BadDataOffsets) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("offsets.safetensors");
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [1], "data_offsets": [0])"), 4);
  expect_open_error(path, {path, "'x'", "[begin, end]"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [1], "data_offsets": {"a": 1})"), 4);
  expect_open_error(path, {path, "'x'", "[begin, end]"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [1], "data_offsets": [8, 4])"), 8);
  expect_open_error(path, {path, "'x'", "begin > end"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [1], "data_offsets": [-4, 0])"), 8);
  expect_open_error(path, {path, "'x'", "negative"});
  write_raw(path, one_entry(R"("dtype": "F32", "shape": [1], "data_offsets": [0, 1.5])"), 8);
  expect_open_error(path, {path, "'x'", "not an integer"});
}

TEST(SafetensorsMalformed, ByteSizeMismatch) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("size.safetensors");
  write_raw(path, one_entry(R"("dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 24])"), 24);
  expect_open_error(path, {path, "'x'", "24 bytes", "expected 12", "BF16", "[2,3]"});
}

TEST(SafetensorsMalformed, TruncatedData) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("trunc.safetensors");
  write_raw(path, one_entry(R"("dtype": "F64", "shape": [4], "data_offsets": [0, 32])"), 20);
  expect_open_error(path, {path, "'x'", "beyond the data section", "20 bytes", "truncated"});
  // The same from a file that was correct and then cut short.
  Tensor t(DType::F32, {64});
  const std::string good = tmp.file("good.safetensors");
  hanpu::write_safetensors(good, {{"w", t.view()}});
  fs::resize_file(good, fs::file_size(good) - 1);
  expect_open_error(good, {good, "'w'", "truncated"});
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("overlap.safetensors");
  write_raw(path,
            R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
            R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
            16);
  expect_open_error(path, {path, "'a'", "'b'", "overlap"});
  // Empty tensors occupy no bytes and so overlap nothing; adjacency is fine.
  write_raw(path,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
            R"( "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},)"
            R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
            16);
  EXPECT_NO_THROW(SafetensorsFile::open(path));
}

TEST(SafetensorsMalformed, BadMetadata) {
  TempDir tmp("hanpu_st");
  const std::string path = tmp.file("meta.safetensors");
  write_raw(path, R"({"__metadata__": {"format": 1}})", 0);
  expect_open_error(path, {path, "__metadata__", "'format'", "string"});
  write_raw(path, R"({"__metadata__": "pt"})", 0);
  expect_open_error(path, {path, "__metadata__"});
}

// --- f16 / bf16 scalar conversions -------------------------------------------------------------

namespace {

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }

// Independent decoding of an f16 bit pattern by its definition.
double f16_value_reference(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Round-to-nearest-even f32 -> f16 by search: the two neighbouring f16 values bracket x, and the
// exact midpoint (representable in double) decides. Positive finite x only.
uint16_t f32_to_f16_reference(float x) {
  if (x >= 65520.0f) return 0x7c00;
  uint16_t lo = 0, hi = 0x7bff;  // largest finite
  if (x >= f16_value_reference(hi)) return hi;
  while (hi - lo > 1) {  // invariant: value(lo) <= x < value(hi)
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (f16_value_reference(mid) <= x) lo = mid;
    else hi = mid;
  }
  const double midpoint = (f16_value_reference(lo) + f16_value_reference(hi)) / 2;
  if (x < midpoint) return lo;
  if (x > midpoint) return hi;
  return (lo & 1u) ? hi : lo;
}

float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST(HalfConversions, F16ToF32MatchesDefinitionAndRoundTripsForAllPatterns) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = hanpu::f16_to_f32(h);
    if (f16_is_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << bits;
      EXPECT_TRUE(f16_is_nan(hanpu::f32_to_f16(f))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), f16_value_reference(h)) << "f16 bits 0x" << std::hex << bits;
    ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << bits;
    ASSERT_EQ(hanpu::f32_to_f16(f), h) << "f16 -> f32 -> f16 changed 0x" << std::hex << bits;
  }
}

TEST(HalfConversions, F32ToF16TrickyValues) {
  struct Case {
    float input;
    uint16_t expected;
    const char* what;
  };
  const float tiny = std::ldexp(1.0f, -24);  // smallest f16 subnormal
  const Case cases[] = {
      {0.0f, 0x0000, "zero"},
      {-0.0f, 0x8000, "negative zero keeps its sign"},
      {1.0f, 0x3c00, "one"},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00, "halfway 1 and 1+ulp: ties to even (down)"},
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02, "halfway 1+ulp and 1+2ulp: ties to even (up)"},
      {std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f), 0x3c01, "just above halfway rounds up"},
      {65504.0f, 0x7bff, "largest finite stays"},
      {std::nextafter(65520.0f, 0.0f), 0x7bff, "just below 65520 stays finite"},
      {65520.0f, 0x7c00, "65520 is halfway to 65536: ties to even -> inf"},
      {-65520.0f, 0xfc00, "negative overflow"},
      {1e10f, 0x7c00, "far overflow"},
      {std::numeric_limits<float>::infinity(), 0x7c00, "inf"},
      {-std::numeric_limits<float>::infinity(), 0xfc00, "-inf"},
      {std::ldexp(1.0f, -14), 0x0400, "smallest normal"},
      {1023 * tiny, 0x03ff, "largest subnormal"},
      {1023.5f * tiny, 0x0400, "halfway largest subnormal / smallest normal: ties to even (up)"},
      {tiny, 0x0001, "smallest subnormal"},
      {tiny / 2, 0x0000, "half the smallest subnormal: ties to even (zero)"},
      {std::nextafter(tiny / 2, 1.0f), 0x0001, "just above half the smallest subnormal"},
      {1.5f * tiny, 0x0002, "halfway 1 and 2 subnormal units: ties to even (2)"},
      {2.5f * tiny, 0x0002, "halfway 2 and 3 subnormal units: ties to even (2)"},
      {-2.5f * tiny, 0x8002, "negative subnormal"},
      {std::numeric_limits<float>::denorm_min(), 0x0000, "f32 subnormal underflows"},
      {-std::numeric_limits<float>::denorm_min(), 0x8000, "f32 subnormal underflows to -0"},
      {0.1f, 0x2e66, "0.1"},
      {-2.0f, 0xc000, "-2"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(hanpu::f32_to_f16(c.input), c.expected)
        << c.what << " (input " << c.input << ", got 0x" << std::hex << hanpu::f32_to_f16(c.input) << ")";
  const uint16_t nan = hanpu::f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(f16_is_nan(nan));
  // A NaN whose payload lives only in the low mantissa bits must not collapse to inf.
  EXPECT_TRUE(f16_is_nan(hanpu::f32_to_f16(bits_to_f32(0x7f800001u))));
}

TEST(HalfConversions, F32ToF16MatchesReferenceOnSampledBitPatterns) {
  // An odd stride walks every exponent with varied low mantissa bits (which decide rounding).
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 4099) {
    const float x = bits_to_f32(static_cast<uint32_t>(bits));
    const uint16_t expected = f32_to_f16_reference(x);
    ASSERT_EQ(hanpu::f32_to_f16(x), expected) << "f32 bits 0x" << std::hex << bits;
    ASSERT_EQ(hanpu::f32_to_f16(-x), expected | 0x8000u) << "f32 bits -0x" << std::hex << bits;
  }
}

TEST(HalfConversions, Bf16RoundTripsAndRounds) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = hanpu::bf16_to_f32(h);
    ASSERT_EQ(f32_to_bits(f), bits << 16);  // bf16 is the top half of f32 by definition
    if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0) {
      EXPECT_TRUE(std::isnan(hanpu::bf16_to_f32(hanpu::f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(hanpu::f32_to_bf16(f), h) << "bf16 -> f32 -> bf16 changed 0x" << std::hex << bits;
  }
  EXPECT_EQ(hanpu::f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80) << "tie to even (down)";
  EXPECT_EQ(hanpu::f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82) << "tie to even (up)";
  EXPECT_EQ(hanpu::f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81) << "above tie";
  EXPECT_EQ(hanpu::f32_to_bf16(bits_to_f32(0x7f7f8000u)), 0x7f80) << "halfway max/inf rounds to inf";
  EXPECT_EQ(hanpu::f32_to_bf16(bits_to_f32(0x7f7f7fffu)), 0x7f7f) << "just below stays finite";
  EXPECT_EQ(hanpu::f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(hanpu::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  const uint16_t low_payload_nan = hanpu::f32_to_bf16(bits_to_f32(0x7f800001u));
  EXPECT_TRUE((low_payload_nan & 0x7f80u) == 0x7f80u && (low_payload_nan & 0x7fu) != 0)
      << "NaN with only low payload bits must stay NaN, got 0x" << std::hex << low_payload_nan;
}

// release_pages drops a mapped tensor's whole pages from the process; the bytes must read the same
// afterwards (they come back from the page cache), read copies are untouched, and a name the file
// does not have is an error naming both.
TEST(Safetensors, ReleasedPagesOfAMappedTensorStillReadTheSame) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  Tensor big(DType::F32, {64, 1024});  // 256 KiB: many whole pages
  for (int64_t i = 0; i < big.numel(); ++i) big.set(i, static_cast<double>(i % 977) - 400.0);
  Tensor small(DType::F32, {3});
  for (int64_t i = 0; i < 3; ++i) small.set(i, static_cast<double>(i) + 0.5);
  hanpu::write_safetensors(path, {{"small", small.view()}, {"big", big.view()}});
  for (const bool mapped : {true, false}) {
    const SafetensorsFile f = mapped ? SafetensorsFile::map(path) : SafetensorsFile::open(path);
    f.prefault();
    f.release_pages("big");
    f.release_pages("small");  // smaller than a page: nothing to drop
    const TensorView b = f.get("big"), s = f.get("small");
    EXPECT_EQ(std::memcmp(b.data, big.data(), big.bytes()), 0) << (mapped ? "mapped" : "read");
    EXPECT_EQ(std::memcmp(s.data, small.data(), small.bytes()), 0) << (mapped ? "mapped" : "read");
    try {
      f.release_pages("absent");
      ADD_FAILURE() << "expected an error for a tensor the file lacks";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("absent"), std::string::npos) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
    }
  }
}
