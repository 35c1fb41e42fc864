// The kernel table from the command line: `--max-isa` runs sparq's kernels on the named target
// (and names it in every row), rejects a name it does not know, and `bench kernels --explain`
// names the chosen kernel of each row and why the others of its layout declined.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include <nlohmann/json.hpp>

#include "io/io_testutil.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

int RunCli(const std::string& args, std::string* out, std::string* err,
           const std::string& env = "") {
  const std::string o = testing::TempDir() + "/kt_stdout.txt",
                    e = testing::TempDir() + "/kt_stderr.txt";
  std::string ignored;
  const int rc =
      testing::RunCommand(env + std::string(SPARQ_CLI_PATH) + " " + args + " >" + o + " 2>" + e, &ignored);
  const testing::Bytes ob = testing::ReadFile(o), eb = testing::ReadFile(e);
  out->assign(ob.begin(), ob.end());
  err->assign(eb.begin(), eb.end());
  return rc;
}

TEST(KernelTableCliTest, MaxIsaRunsAndNamesTheCappedTarget) {
  std::string out, err;
  // SSE4 exists on every x86-64 CPU the project supports; the rows then name it, not the best.
  ASSERT_EQ(RunCli("--max-isa SSE4 bench kernels --shapes 64x64 --n 1,70 --patterns 2:4 --threads 1 "
                "--repeats 1 --py-peers '' --rotate-bytes 0 --json",
                &out, &err),
            0)
      << err;
  const json rows = json::parse(out);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r["isa"], "SSE4") << r;
    // The AVX2-only rows of the table decline on SSE4: the generic rows run.
    EXPECT_THAT(r["kernel"].get<std::string>(), ::testing::Not(HasSubstr("__avx2"))) << r;
  }
  // The old spelling, the SPARQ_MAX_ISA variable, still works (read by the CLI, not the library).
  ASSERT_EQ(RunCli("bench kernels --shapes 64x64 --n 1 --patterns 2:4 --threads 1 --repeats 1 "
                   "--py-peers '' --rotate-bytes 0 --json",
                   &out, &err, "SPARQ_MAX_ISA=SSE4 "),
            0)
      << err;
  const json old = json::parse(out);
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0]["isa"], "SSE4") << old[0];
}

// `bench kernels` shortens the peers' idle spins (tools/main.cc) however the command is spelled:
// with the global options before `bench` too (it looked at the first word only, so every
// `sparq --int8-activations bench kernels` ran its 2-thread rows beside a spinning peer thread).
TEST(KernelTableCliTest, PeersSpinShortWithOptionsBeforeBench) {
  const std::string run = "bench kernels --shapes 64x64 --n 1 --patterns 2:4 --threads 1 "
                          "--repeats 1 --py-peers '' --rotate-bytes 0";
  for (const std::string before : {"", "--int8-activations ", "--max-isa SSE4 ",
                                   "--max-isa=SSE4 --int8-activations "}) {
    std::string out, err;
    // env -u: a value the user set is kept, so the test starts without one.
    ASSERT_EQ(RunCli(before + run, &out, &err, "env -u OPENBLAS_THREAD_TIMEOUT -u GOMP_SPINCOUNT "),
              0)
        << before << err;
    EXPECT_THAT(out, HasSubstr("OPENBLAS_THREAD_TIMEOUT=20, GOMP_SPINCOUNT=10000")) << before << out;
  }
  std::string out, err;
  ASSERT_EQ(RunCli(run, &out, &err, "OPENBLAS_THREAD_TIMEOUT=25 GOMP_SPINCOUNT=7 "), 0) << err;
  EXPECT_THAT(out, HasSubstr("OPENBLAS_THREAD_TIMEOUT=25, GOMP_SPINCOUNT=7")) << out;
}

// The machine limits run on the capped target too (the kernels' fractions of them compare like
// with like): `bench machine` names the target it measured.
TEST(KernelTableCliTest, MachineLimitsRunOnTheCappedTarget) {
  std::string out, err;
  ASSERT_EQ(RunCli("--max-isa SSE4 bench machine", &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("isa: SSE4\n")) << out;
  EXPECT_THAT(out, HasSubstr("threads 2: peak FMA")) << out;
}

TEST(KernelTableCliTest, UnknownMaxIsaIsAnErrorNamingIt) {
  std::string out, err;
  EXPECT_EQ(RunCli("--max-isa AVX9000 bench machine", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--max-isa AVX9000"));
}

TEST(KernelTableCliTest, ExplainNamesTheChosenKernelAndTheDeclines) {
  std::string out, err;
  ASSERT_EQ(RunCli("bench kernels --explain --shapes 256x256 --n 1,512 --patterns 2:4,unstructured:0.9",
                &out, &err),
            0)
      << err;
  // Four rows (2 patterns x 2 token counts), each with its chosen kernel.
  size_t chosen = 0;
  for (size_t at = out.find("chosen: "); at != std::string::npos; at = out.find("chosen: ", at + 1)) {
    ++chosen;
  }
  EXPECT_EQ(chosen, 4u) << out;
  EXPECT_THAT(out, HasSubstr("256x256 2:4 f32 n=512 (stored as nm 2:4 f32)"));
  EXPECT_THAT(out, HasSubstr("chosen: f32_csr_decode_1x1"));
  // At 512 tokens the decode row of the weight's layout declines, and says why.
  EXPECT_THAT(out, HasSubstr("declined f32_nm_m4_gather_decode_4xT: serves n in [0, 16], not 512"));
  EXPECT_THAT(out, HasSubstr("declined f32_csr_decode_1x1: serves n in [0, 16], not 512"));
}

// The `isa: NAME` line `bench kernels --explain` starts with: the target the capped run chose
// (the cap itself, or the best below it that this CPU has).
std::string IsaOf(const std::string& out) {
  const size_t at = out.find("isa: ");
  if (at == std::string::npos) return "";
  return out.substr(at + 5, out.find('\n', at) - at - 5);
}

// The kernel `--explain` chose for the row headed `header` (the first word after "chosen: " on the
// line that follows it), or "" when there is no such row.
std::string ChosenFor(const std::string& out, const std::string& header) {
  const size_t at = out.find(header + " (stored as");
  if (at == std::string::npos) return "";
  const size_t c = out.find("\nchosen: ", at);
  if (c == std::string::npos || c != out.find('\n', at)) return "";
  const size_t b = c + 9;
  return out.substr(b, out.find_first_of(" \n", b) - b);
}

// The default activations (int8; also spelled --activations int8 and --int8-activations): on
// AVX3_DL and on AVX2 a 2:4 int4 weight with groups of 64 decodes on the target's int8-X row, one
// with groups of 32 keeps the f32-X row and says why; with --activations f32 (or on AVX3 without
// VNNI) the int8-X rows decline and name the reason. The two spellings together are refused.
TEST(KernelTableCliTest, Int8ActivationsChooseTheIntegerRowWhereItRuns) {
  std::string out, err;
  const std::string run = "bench kernels --explain --shapes 128x256 --n 1 --patterns 2:4 "
                          "--values int4:g64,int4:g32";
  for (const std::string act : {"", "--activations int8 ", "--int8-activations "}) {
    ASSERT_EQ(RunCli(act + run, &out, &err), 0) << act << err;
    const std::string g64 = ChosenFor(out, "128x256 2:4 int4:g64 n=1");
    const std::string g32 = ChosenFor(out, "128x256 2:4 int4:g32 n=1");
    EXPECT_THAT(g32, ::testing::Not(HasSubstr("_x8"))) << out;
    if (IsaOf(out) == "AVX3_DL" || IsaOf(out) == "AVX2") {
      EXPECT_EQ(g64, IsaOf(out) == "AVX2" ? "i4_nm24_decode_4x1_x8__avx2"
                                          : "i4_nm24_decode_4x1_x8__avx3_dl")
          << act << out;
      EXPECT_THAT(out, HasSubstr("needs groups of 64 or more, the weight's are 32")) << out;
    } else {
      EXPECT_THAT(g64, ::testing::Not(HasSubstr("_x8"))) << out;
      EXPECT_THAT(out, HasSubstr("declined i4_nm24_decode_4x1_x8__avx3_dl: runs on")) << out;
    }
  }
  ASSERT_EQ(RunCli("--max-isa AVX2 " + run, &out, &err), 0) << err;
  if (IsaOf(out) == "AVX2") {  // (a CPU without AVX2 reports SSE4: no int8-X row)
    EXPECT_EQ(ChosenFor(out, "128x256 2:4 int4:g64 n=1"), "i4_nm24_decode_4x1_x8__avx2") << out;
  }
  ASSERT_EQ(RunCli("--max-isa AVX3_DL --activations f32 " + run, &out, &err), 0) << err;
  EXPECT_THAT(ChosenFor(out, "128x256 2:4 int4:g64 n=1"), ::testing::Not(HasSubstr("_x8"))) << out;
  if (IsaOf(out) == "AVX3_DL") {
    EXPECT_THAT(out, HasSubstr("rounds X to int8: off (--activations f32)")) << out;
  }
  EXPECT_NE(RunCli("--int8-activations --activations f32 " + run, &out, &err), 0);
  EXPECT_THAT(err, HasSubstr("--activations")) << err;
  EXPECT_NE(RunCli("--activations int4 " + run, &out, &err), 0);
  EXPECT_THAT(err, HasSubstr("int4")) << err;
}

// --values with quantized specs: the N:M rows run the i8 / i4 kernels (and say so), a spec the
// parser does not know or a layout without quantized kernels is an error naming it. Which i8 / i4
// row a 2:4 weight gets depends on the target, so every run names its cap (--max-isa) and the
// chosen rows are checked against the target it reports: a row of the spec's value kind, of the
// right mode, generic or written for that target (`__avx2` on AVX2, ...). SSE4 exists on every
// x86-64 CPU the project supports; on a CPU without AVX2 (or AVX-512) the AVX2 (AVX3) run reports
// the best target below its cap and is checked against that one.
::testing::AssertionResult RowFits(const std::string& row, const std::string& values,
                                   const std::string& mode, const std::string& isa) {
  std::string suffix = isa;
  for (char& ch : suffix) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const size_t at = row.find("__");
  const bool target_ok = at == std::string::npos || row.substr(at + 2) == suffix;
  if (row.rfind(values + "_nm", 0) == 0 && row.find("_" + mode + "_") != std::string::npos &&
      target_ok) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "'" << row << "' is not a " << values << " N:M " << mode
                                       << " row for " << isa;
}

TEST(KernelTableCliTest, QuantizedValuesRunTheirRowsOrNameWhatDoesNotFit) {
  std::string out, err;
  for (const std::string cap : {"SSE4", "AVX2", "AVX3"}) {
    ASSERT_EQ(RunCli("--max-isa " + cap + " bench kernels --explain --shapes 128x256 --n 1,64 "
                     "--patterns 2:4 --values int8:g32,int4:g64:sym",
                     &out, &err),
              0)
        << err;
    const std::string isa = IsaOf(out);
    if (cap == "SSE4") {
      EXPECT_EQ(isa, "SSE4") << out;
    }
    SCOPED_TRACE("--max-isa " + cap + " ran on " + isa);
    EXPECT_TRUE(RowFits(ChosenFor(out, "128x256 2:4 int8:g32 n=1"), "i8", "decode", isa)) << out;
    EXPECT_TRUE(RowFits(ChosenFor(out, "128x256 2:4 int8:g32 n=64"), "i8", "tiled", isa)) << out;
    EXPECT_TRUE(RowFits(ChosenFor(out, "128x256 2:4 int4:g64:sym n=1"), "i4s", "decode", isa))
        << out;
    EXPECT_TRUE(RowFits(ChosenFor(out, "128x256 2:4 int4:g64:sym n=64"), "i4s", "tiled", isa))
        << out;
    if (isa == "AVX2") {  // AVX2's own 2:4 decode (the halves window)
      EXPECT_EQ(ChosenFor(out, "128x256 2:4 int8:g32 n=1"), "i8_nm24_decode_4xT__avx2") << out;
    }
  }
  const std::string json_path = testing::TempDir() + "/kt_quant.json";
  for (const std::string cap : {"SSE4", "AVX2"}) {
    ASSERT_EQ(RunCli("--max-isa " + cap + " bench kernels --shapes 128x256 --n 1 --patterns 2:4 "
                     "--values int4:g64 --threads 1 --repeats 1 --py-peers '' --rotate-bytes 0 "
                     "--json " + json_path,
                     &out, &err),
              0)
        << err;
    const testing::Bytes jb = testing::ReadFile(json_path);
    const json rows = json::parse(std::string(jb.begin(), jb.end()));
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0]["values"], "int4:g64");
    const std::string isa = rows[0]["isa"].get<std::string>();
    if (cap == "SSE4") {
      EXPECT_EQ(isa, "SSE4") << rows[0];
    }
    // int4 with a min: the i4 rows (symmetric int4 above: i4s)
    const std::string kernel = rows[0]["kernel"].get<std::string>();
    EXPECT_TRUE(RowFits(kernel.substr(0, kernel.find('(')), "i4", "decode", isa)) << rows[0];
    EXPECT_THAT(kernel, HasSubstr("(nm 2:4 int4:g64)")) << "--max-isa " << cap;
  }
  EXPECT_EQ(RunCli("bench kernels --explain --shapes 64x64 --n 1 --patterns 2:4 --values int5", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("values 'int5'"));
  // Every layout stores quantized values now (BSR and V:N:M run their codes); an N:M whose n
  // does not divide 16 packs as CSR rows, which take no codes.
  EXPECT_EQ(RunCli("bench kernels --explain --shapes 64x64 --n 1 --patterns 3:8 --values int4:g64",
                   &out, &err),
            1);
  EXPECT_THAT(
      err, HasSubstr("int4:g64 values need N:M with n dividing 16 (this 3:8 packs as CSR rows)"));
  EXPECT_EQ(
      RunCli(
          "bench kernels --explain --shapes 64x64 --n 1 --patterns block:16x16 --values int4:g64",
          &out, &err),
      0)
      << err;
  EXPECT_THAT(out, HasSubstr("stored as bsr 16x16 int4:g64"));
  EXPECT_THAT(out, HasSubstr("chosen: i4_rowgroups_decode_Gx1"));
}

}  // namespace
}  // namespace sparq
