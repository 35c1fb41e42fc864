// The `--json [FILE]` convention (tools/json_output.h) on commands that need no model, and the
// metadata preview of `sparq inspect`, which cut a multi-byte character at byte 256 and then
// exited 2 ("invalid UTF-8 byte at index 256") when writing JSON.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_testutil.h"
#include "io/io_testutil.h"
#include "sparq/checkpoint.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

using testing::Cli;
using testing::RunSplit;
using testing::Slurp;

// A .sparq checkpoint whose metadata values put a 2-byte character (é) and a 3-byte one (✓)
// across the previews' cuts: 256 bytes in JSON, 100 in the table.
const std::string kLong = std::string(255, 'a') + "\xc3\xa9" + std::string(20, 'b');
const std::string kShort = std::string(98, 'a') + "\xe2\x9c\x93" + "cd";

std::string MakeCheckpoint() {
  const std::string path = testing::TempDir() + "/meta.sparq";
  Checkpoint ck;
  Tensor w = Tensor::Alloc(DType::kF32, {4, 8});
  // Row r keeps columns j with (j + r) % 4 < 2: 2:4, with no two rows alike in a group of 4
  // (so not V:N:M).
  for (uint64_t i = 0; i < w.numel(); ++i) {
    w.mutable_data_as<float>()[i] = ((i % 8 + i / 8) % 4 < 2) ? 1.0f + i : 0.0f;
  }
  DenseMatrix dm;
  dm.rows = 4;
  dm.cols = 8;
  dm.values = std::move(w);
  ck.matrices.push_back({"w", SparseMatrix(std::move(dm)), Pattern::Dense()});
  ck.metadata = {{"long", kLong}, {"short", kShort}};
  const Status st = WriteCheckpoint(path, ck);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return path;
}

TEST(InspectCliTest, MetadataPreviewCutsOnACharacterBoundary) {
  const std::string path = MakeCheckpoint();
  std::string out, err;
  ASSERT_EQ(RunSplit("inspect " + path + " --json", &out, &err), 0) << err;
  const json j = json::parse(out);  // throws on invalid UTF-8 or anything beside the document
  // The cut backs off to before é (bytes 255-256), so 255 bytes are kept, then the full size.
  EXPECT_EQ(j["metadata"]["long"], std::string(255, 'a') + "... (277 bytes)");
  EXPECT_EQ(j["metadata"]["short"], kShort);  // under 256 bytes: whole
  ASSERT_EQ(RunSplit("inspect " + path, &out, &err), 0) << err;
  // Table: cut at 100 bytes, before ✓ (bytes 98-100).
  EXPECT_THAT(out, HasSubstr("  short = " + std::string(98, 'a') + "... (103 bytes)\n"));
  EXPECT_THAT(out, HasSubstr("  long = " + std::string(100, 'a') + "... (277 bytes)\n"));
}

// A GGUF string that is not UTF-8 at all (GGUF does not promise it): each bad byte becomes U+FFFD
// in the JSON, instead of exit 2.
TEST(InspectCliTest, MetadataThatIsNotUtf8BecomesReplacementCharacters) {
  testing::GgufBuilder g;
  g.Kv("general.architecture", 8, testing::EncStr("llama"));
  g.Kv("bad", 8, testing::EncStr("x\xff\xfey"));
  testing::Bytes f32;
  for (int i = 0; i < 8; ++i) testing::Append(f32, testing::EncF32(1.0f + i));
  g.Tensor({"n", {8}, 0, f32});
  const std::string path = testing::TempDir() + "/bad_utf8.gguf";
  testing::WriteFile(path, g.Build());
  std::string out, err;
  ASSERT_EQ(RunSplit("inspect " + path + " --json", &out, &err), 0) << err;
  const json j = json::parse(out);
  EXPECT_EQ(j["metadata"]["bad"], "\"x\xef\xbf\xbd\xef\xbf\xbdy\"");
}

// inspect's three modes: the table; bare --json (stdout is one JSON document and nothing else);
// --json FILE (the table on stdout, the same document in FILE, no temporary file left); `--json -`
// is bare --json; a bare --json before another option.
TEST(JsonFlagTest, InspectTableStdoutAndFile) {
  const std::string path = MakeCheckpoint();
  std::string table, out, err;
  ASSERT_EQ(RunSplit("inspect " + path, &table, &err), 0) << err;
  EXPECT_THAT(table, HasSubstr("total: 1 tensors"));
  ASSERT_EQ(RunSplit("inspect " + path + " --json", &out, &err), 0) << err;
  const json doc = json::parse(out);
  EXPECT_EQ(doc["kind"], "sparq");
  ASSERT_EQ(doc["tensors"].size(), 1u);
  EXPECT_EQ(doc["tensors"][0]["pattern"], "2:4");
  std::string again;
  ASSERT_EQ(RunSplit("inspect " + path + " --json -", &again, &err), 0) << err;
  EXPECT_EQ(again, out);
  ASSERT_EQ(RunSplit("inspect " + path + " --json --threads 1", &again, &err), 0) << err;
  EXPECT_EQ(again, out);

  const std::string dir = testing::TempDir() + "/json_out";
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/inspect.json";
  ASSERT_EQ(RunSplit("inspect " + path + " --json " + file, &out, &err), 0) << err;
  EXPECT_EQ(out, table);
  EXPECT_EQ(json::parse(Slurp(file)), doc);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) entries += e.exists();
  EXPECT_EQ(entries, 1) << "a temporary file was left beside " << file;

  // An unwritable FILE: exit 1, one line naming the flag and the file, the table not printed.
  ASSERT_EQ(RunSplit("inspect " + path + " --json /nonexistent_dir/x.json", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--json"));
  EXPECT_THAT(err, HasSubstr("/nonexistent_dir/x.json"));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// bench kernels at one tiny shape (a functional run, not a timing): bare --json puts the rows
// alone on stdout (the table goes to stderr), --json FILE (the old spelling) writes them to FILE
// with the table on stdout.
TEST(JsonFlagTest, BenchKernelsRowsOnStdoutOrInAFile) {
  const std::string flags =
      " bench kernels --shapes 64x64 --n 1 --patterns 2:4 --threads 1 --repeats 1 --py-peers ''";
  std::string out, err;
  ASSERT_EQ(RunSplit(flags + " --json", &out, &err), 0) << err;
  const json rows = json::parse(out);
  ASSERT_TRUE(rows.is_array());
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_EQ(rows[0]["m"], 64);
  EXPECT_EQ(rows[0]["pattern"], "2:4");
  EXPECT_THAT(err, HasSubstr("machine, 1 thread(s)"));  // the table went to stderr
  const std::string file = testing::TempDir() + "/kernels.json";
  ASSERT_EQ(RunSplit(flags + " --json " + file, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("machine, 1 thread(s)"));
  EXPECT_THAT(out, Not(HasSubstr("\"median_s\"")));
  const json from_file = json::parse(Slurp(file));
  ASSERT_EQ(from_file.size(), 1u);
  EXPECT_EQ(from_file[0]["kernel"], rows[0]["kernel"]);
}

}  // namespace
}  // namespace sparq
