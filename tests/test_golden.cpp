// Agreement with flash-linear-attention: every file in tests/golden/*.safetensors holds inputs and
// the outputs of FLA's own naive fp32 references (tests/golden/README.md). Every CPU path, with 1
// and 2 threads, and our fp64 reference la_reference are compared with o_ref / final_state_ref.
//
// Tolerances (normalized MSE ||x-ref||^2/||ref||^2): the FLA references are fp32 recurrences, so
// they carry fp32 rounding (relative error ~1e-7 per element, nmse ~1e-14..1e-12 measured); a
// bound of 1e-9 for fp32 results leaves margin above that noise while still catching any semantic
// difference (a wrong scale, gate or head mapping gives nmse >= 1e-4). An output stored in bf16
// (v is bf16, so o is bf16) carries bf16 rounding, relative 2^-9, nmse ~1e-6: bound 1e-5. The
// final state is always fp32: 1e-9.
#include <gtest/gtest.h>

#include "la_testing.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "hanpu/la.hpp"
#include "hanpu/reference.hpp"
#include "io/safetensors.hpp"

namespace fs = std::filesystem;

namespace hanpu {
namespace {

constexpr double kF32Bound = 1e-9;
constexpr double kBf16Bound = 1e-5;
constexpr double kF16Bound = 1e-7;

double output_bound(DType dt) {
  switch (dt) {
    case DType::BF16: return kBf16Bound;
    case DType::F16: return kF16Bound;
    default: return kF32Bound;
  }
}

// The golden directory: $HANPU_SOURCE_DIR/tests/golden (CTest sets it), else next to this file.
using hanpu::testing::golden_dir;


std::vector<fs::path> golden_files() {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(golden_dir(), ec))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

using hanpu::testing::nmse;

std::string meta(const SafetensorsFile& f, const std::string& key) {
  const auto it = f.metadata().find(key);
  if (it == f.metadata().end()) throw Error(f.path() + ": no __metadata__ key '" + key + "'");
  return it->second;
}

bool meta_flag(const SafetensorsFile& f, const std::string& key) {
  const std::string v = meta(f, key);
  if (v != "0" && v != "1") throw Error(f.path() + ": __metadata__ '" + key + "' is '" + v + "', expected 0 or 1");
  return v == "1";
}

struct Golden {
  SafetensorsFile file;
  Variant variant = Variant::GDN;
  LaInputs in;
  LaOptions opt;
  Tensor o_ref, state_ref;
};

Golden load_golden(const fs::path& path) {
  Golden g{SafetensorsFile::open(path.string())};
  const SafetensorsFile& f = g.file;
  const std::string variant = meta(f, "variant");
  if (variant != "gdn" && variant != "kda") throw Error(path.string() + ": unknown variant '" + variant + "'");
  g.variant = variant == "gdn" ? Variant::GDN : Variant::KDA;
  g.opt.scale = static_cast<float>(std::stod(meta(f, "scale")));
  g.opt.qk_l2norm = meta_flag(f, "l2norm");
  g.opt.gate_in_kernel = meta_flag(f, "gate_in_kernel");
  g.opt.beta_sigmoid = meta_flag(f, "beta_sigmoid");
  auto opt_view = [&](const char* name) { return f.has(name) ? f.get(name) : TensorView{}; };
  g.in.q = f.get("q");
  g.in.k = f.get("k");
  g.in.v = f.get("v");
  g.in.g = f.get("g");
  g.in.beta = f.get("beta");
  g.in.initial_state = opt_view("initial_state");
  g.in.cu_seqlens = opt_view("cu_seqlens");
  g.in.A_log = opt_view("A_log");
  g.in.dt_bias = opt_view("dt_bias");
  g.o_ref = f.load_copy("o_ref");
  g.state_ref = f.load_copy("final_state_ref");
  return g;
}

const char* const kExpectedFiles[] = {"gdn_basic", "gdn_bf16_gate", "gdn_varlen", "kda_basic", "kda_gate_varlen"};

// CTest runs from the source tree, so a missing directory is a broken checkout: fail, never skip.
TEST(Golden, DirectoryHasTheFiles) {
  const fs::path dir = golden_dir();
  ASSERT_TRUE(fs::is_directory(dir)) << "golden directory " << dir << " is missing (set HANPU_SOURCE_DIR)";
  for (const char* name : kExpectedFiles)
    EXPECT_TRUE(fs::is_regular_file(dir / (std::string(name) + ".safetensors"))) << name << " missing in " << dir;
}

TEST(Golden, AllPathsAndReferenceAgreeWithFla) {
  const std::vector<fs::path> files = golden_files();
  ASSERT_FALSE(files.empty()) << "no *.safetensors in golden directory " << golden_dir();
  std::printf("%-16s %-10s %3s %-5s %12s %12s %10s %10s\n", "file", "path", "thr", "o", "nmse(o)", "nmse(state)",
              "bound(o)", "bound(st)");
  for (const fs::path& path : files) {
    SCOPED_TRACE(path.string());
    Golden g;
    try {
      g = load_golden(path);
    } catch (const Error& e) {
      ADD_FAILURE() << "cannot load golden file: " << e.what();
      continue;
    }
    const std::string name = path.stem().string();
    const double o_bound = output_bound(g.in.v.dtype);

    // Our fp64 reference: checks that our semantics are FLA's (its o is F64, whatever the inputs).
    const LaReference ref = la_reference(g.variant, g.in, g.opt);
    const double ref_o = nmse(ref.o, g.o_ref), ref_s = nmse(ref.final_state, g.state_ref);
    std::printf("%-16s %-10s %3s %-5s %12.3g %12.3g %10.0e %10.0e\n", name.c_str(), "reference", "-", "F64", ref_o,
                ref_s, kF32Bound, kF32Bound);
    EXPECT_LE(ref_o, kF32Bound) << name << ": la_reference o vs FLA o_ref";
    EXPECT_LE(ref_s, kF32Bound) << name << ": la_reference final_state vs FLA final_state_ref";

    // Control: the bound discriminates. A 0.1% error in the query scale (o changes by ~1e-3
    // relative, nmse ~1e-6) must fail it.
    LaOptions wrong = g.opt;
    wrong.scale = *g.opt.scale * 1.001f;
    const double wrong_o = nmse(la_reference(g.variant, g.in, wrong).o, g.o_ref);
    EXPECT_GT(wrong_o, 100 * kF32Bound) << name << ": a 0.1% scale error should be detected";

    for (CpuPath cp : {CpuPath::HeadFused, CpuPath::FlaChunk, CpuPath::Recurrent}) {
      for (int threads : {1, 2}) {
        LaResult r;
        try {
          r = la_prefill_alloc(g.variant, g.in, g.opt, ExecOptions{cp, threads, nullptr});
        } catch (const std::exception& e) {
          ADD_FAILURE() << name << " " << cpu_path_name(cp) << " threads " << threads << ": threw " << e.what();
          continue;
        }
        EXPECT_EQ(r.o.dtype(), g.in.v.dtype) << name << ": o must have v's dtype";
        const double eo = nmse(r.o, g.o_ref), es = nmse(r.final_state, g.state_ref);
        std::printf("%-16s %-10s %3d %-5s %12.3g %12.3g %10.0e %10.0e\n", name.c_str(), cpu_path_name(cp), threads,
                    dtype_name(r.o.dtype()), eo, es, o_bound, kF32Bound);
        EXPECT_LE(eo, o_bound) << name << " " << cpu_path_name(cp) << " threads " << threads << ": o vs o_ref";
        EXPECT_LE(es, kF32Bound) << name << " " << cpu_path_name(cp) << " threads " << threads
                                 << ": final_state vs final_state_ref";
      }
    }

    // The engine's GEMMs on AMX (ExecOptions::amx; GDN and KDA with bf16 q/k on an AMX CPU, else it
    // says why not): split within the same bounds (KDA's states: 5e-10, its products round both
    // operands), round within its own (docs/ACCURACY.md, 1e-4).
    for (LaAmx mode : {LaAmx::Split, LaAmx::Round}) {
      ExecReport rep;
      ExecOptions ex{CpuPath::HeadFused, 2, nullptr};
      ex.amx = mode;
      ex.report = &rep;
      const LaResult r = la_prefill_alloc(g.variant, g.in, g.opt, ex);
      const bool ran = rep.gemms.rfind("amx-", 0) == 0;
      if (g.in.q.dtype == DType::BF16 && rep.gemms.rfind("f32 (amx: no usable", 0) != 0)
        EXPECT_TRUE(ran) << name << ": " << rep.gemms;
      if (!ran) continue;
      const double eo = nmse(r.o, g.o_ref), es = nmse(r.final_state, g.state_ref);
      const bool split = mode == LaAmx::Split;
      const double split_state = g.variant == Variant::KDA ? 5e-10 : kF32Bound;
      std::printf("%-16s %-10s %3d %-5s %12.3g %12.3g %10.0e %10.0e\n", name.c_str(), rep.gemms.c_str(), 2,
                  dtype_name(r.o.dtype()), eo, es, split ? o_bound : 1e-4, split ? split_state : 1e-4);
      EXPECT_LE(eo, split ? o_bound : 1e-4) << name << " " << rep.gemms << ": o vs o_ref";
      EXPECT_LE(es, split ? split_state : 1e-4) << name << " " << rep.gemms << ": final_state vs final_state_ref";
    }
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace hanpu
