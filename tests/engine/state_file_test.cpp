// State files on tiny-flash (CSA, HCA and SWA layers): a state saved to disk and loaded into a
// fresh sequence continues bit-identically to a sequence that never stopped; every damaged or
// foreign file is refused with an error that names the file and the reason; restore refuses a
// snapshot that does not fit the sequence and leaves the sequence as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/state_file.h"
#include "fixtures.h"
#include "model/synthetic.h"

namespace dsv4::engine {

class StateFile : public testing::Test {
 protected:
  void SetUp() override {
    model_ = Model::load(test::fixture_model("tiny-flash"));
    tokens_ = test::read_tokens(test::fixture_logits("tiny-flash") + "/tokens.json");
    engine_ = std::make_unique<Engine>(*model_, make_cpu_backend(Numerics::deepseek));
    fingerprint_ = fingerprint(Numerics::deepseek, engine_->state_layout());
    dir_ = std::filesystem::path(testing::TempDir()) /
           ("state_file_" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
    path_ = dir_ / "state.bin";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  StateFingerprint fingerprint(Numerics numerics, StateLayout layout) const {
    return state_fingerprint(model_->config(), model_->weights(), numerics, layout);
  }
  std::span<const int32_t> tokens(int64_t begin, int64_t n) const {
    return std::span<const int32_t>(tokens_).subspan(size_t(begin), size_t(n));
  }
  // Runs the first `n` tokens and saves the state to path_.
  void save_after(int64_t n) {
    SequenceState seq = engine_->new_sequence();
    engine_->prefill(seq, tokens(0, n), 0, false);  // prefill: n may be 0
    save_state(path_, fingerprint_, tokens(0, n), seq.snapshot(), engine_->backend());
  }
  // The message of the error that loading path_ with `expected` throws ("" when none).
  std::string load_error(const StateFingerprint& expected) {
    try {
      load_state(path_, expected, engine_->backend());
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_input) << e.what();
      return e.what();
    }
    return "";
  }
  // Expects restoring `snap` into `target` to be refused with an error containing `message`.
  static void expect_restore_refused(SequenceState& target, const StateSnapshot& snap, const std::string& message) {
    try {
      target.restore(snap);
      ADD_FAILURE() << "restored: " << message;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_input);
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  void overwrite_bytes(size_t offset, const std::string& bytes) {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(offset));
    f.write(bytes.data(), std::streamsize(bytes.size()));
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> tokens_;
  StateFingerprint fingerprint_;
  std::filesystem::path dir_, path_;
};

TEST_F(StateFile, LoadedStateContinuesBitIdentically) {
  // 262 is neither a multiple of 4 nor 128 nor inside the first window: the carries, the ring and
  // the compressed rows all matter.
  const int64_t at = 262, rest = 150;
  for (StateLayout layout : {StateLayout::compact, StateLayout::f32}) {
    SCOPED_TRACE(to_string(layout));
    Engine eng(*model_, make_cpu_backend(Numerics::deepseek), layout);
    SequenceState original = eng.new_sequence();
    eng.forward(original, tokens(0, at), false);
    const StateSnapshot snap = original.snapshot();
    save_state(path_, fingerprint(Numerics::deepseek, layout), tokens(0, at), snap, eng.backend());
    const std::vector<float> want = eng.forward(original, tokens(at, rest), true);

    const SavedState saved = load_state(path_, fingerprint(Numerics::deepseek, layout), eng.backend());
    EXPECT_EQ(saved.tokens, std::vector<int32_t>(tokens_.begin(), tokens_.begin() + at));
    EXPECT_EQ(saved.snapshot.n_past, at);
    EXPECT_EQ(saved.snapshot.bytes(), snap.bytes());
    SequenceState resumed = eng.new_sequence();
    eng.forward(resumed, tokens(2000, 60), false);  // some other conversation first
    resumed.restore(saved.snapshot);
    EXPECT_EQ(resumed.n_past, at);
    const std::vector<float> got = eng.forward(resumed, tokens(at, rest), true);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 1) << "a temporary file was left";
  }
}

// A drafting sequence's state keeps the MTP block's part (its ring, position and waiting rows): drafts
// after loading it are those the sequence would have made, bit for bit.
TEST_F(StateFile, ADraftingStateRoundTripsWithItsDrafts) {
  const int64_t at = 150, waiting = 7, rest = 20;
  SequenceState original = engine_->new_sequence(true);
  engine_->forward(original, tokens(0, at), false);
  engine_->draft(original, tokens_[size_t(at)], LogitRows::none);
  engine_->forward(original, tokens(at, waiting), false);  // positions the block has not run yet
  const StateSnapshot snap = original.snapshot();
  ASSERT_TRUE(snap.draft.has_value());
  EXPECT_EQ(snap.draft->tokens.size(), size_t(waiting));
  save_state(path_, fingerprint_, tokens(0, at + waiting), snap, engine_->backend());

  const SavedState saved = load_state(path_, fingerprint_, engine_->backend());
  EXPECT_EQ(saved.snapshot.bytes(), snap.bytes());
  SequenceState resumed = engine_->new_sequence(true);
  engine_->forward(resumed, tokens(2000, 200), false);  // another conversation's rows in the block's ring
  engine_->draft(resumed, 3, LogitRows::none);
  resumed.restore(saved.snapshot);
  for (SequenceState* seq : {&original, &resumed}) engine_->forward(*seq, tokens(at + waiting, rest), false);
  const std::vector<float> want = engine_->draft(original, tokens_[size_t(at + waiting + rest)], LogitRows::all);
  const std::vector<float> got = engine_->draft(resumed, tokens_[size_t(at + waiting + rest)], LogitRows::all);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);

  // A sequence that does not draft takes the rest of the state and leaves the block's part.
  SequenceState plain = engine_->new_sequence();
  plain.restore(saved.snapshot);
  EXPECT_EQ(plain.n_past, at + waiting);
}

// A version 1 file (written before the MTP block's part existed) is still read. The test makes one
// from a version 2 file of a sequence that does not draft: the same bytes with version 1 and
// without the "no MTP part" flag byte, and the checksum recomputed by the format's rule (FNV-1a's
// step over 8-byte little-endian words, a last partial word zero-padded).
TEST_F(StateFile, AVersionOneFileIsStillRead) {
  const int64_t at = 262, rest = 40;
  SequenceState original = engine_->new_sequence();
  engine_->forward(original, tokens(0, at), false);
  save_state(path_, fingerprint_, tokens(0, at), original.snapshot(), engine_->backend());
  const std::vector<float> want = engine_->forward(original, tokens(at, rest), true);

  std::string bytes;
  {
    std::ifstream in(path_, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 9u);
  ASSERT_EQ(bytes[bytes.size() - 9], '\0') << "the flag byte of a state without an MTP part";
  bytes.erase(bytes.size() - 9);  // the flag and the old checksum
  const uint32_t version = 1;
  std::memcpy(bytes.data() + 8, &version, sizeof(version));
  uint64_t sum = 14695981039346656037ull;
  for (size_t i = 0; i < bytes.size(); i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + i, std::min<size_t>(8, bytes.size() - i));
    sum = (sum ^ word) * 1099511628211ull;
  }
  bytes.append(reinterpret_cast<const char*>(&sum), sizeof(sum));
  std::ofstream(path_, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));

  const SavedState saved = load_state(path_, fingerprint_, engine_->backend());
  EXPECT_FALSE(saved.snapshot.draft.has_value());
  SequenceState resumed = engine_->new_sequence();
  resumed.restore(saved.snapshot);
  const std::vector<float> got = engine_->forward(resumed, tokens(at, rest), true);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST_F(StateFile, AnEmptyStateRoundTrips) {
  // What `generate --prompt-cache` saves for a one-token prompt: no tokens, no compressed rows.
  save_after(0);
  const SavedState saved = load_state(path_, fingerprint_, engine_->backend());
  EXPECT_TRUE(saved.tokens.empty());
  SequenceState fresh = engine_->new_sequence(), resumed = engine_->new_sequence();
  engine_->forward(resumed, tokens(0, 5), false);
  resumed.restore(saved.snapshot);
  EXPECT_EQ(engine_->forward(resumed, tokens(0, 5), true), engine_->forward(fresh, tokens(0, 5), true));
}

TEST_F(StateFile, RefusesAFileThatIsNotAStateFile) {
  std::ofstream(path_) << "{\"tokens\": [1, 2, 3]}";
  const std::string error = load_error(fingerprint_);
  EXPECT_NE(error.find(path_.string()), std::string::npos) << error;
  EXPECT_NE(error.find("not a dsv4 state file"), std::string::npos) << error;
}

TEST_F(StateFile, RefusesAnotherFormatVersion) {
  save_after(10);
  overwrite_bytes(8, std::string("\x07\x00\x00\x00", 4));
  const std::string error = load_error(fingerprint_);
  EXPECT_NE(error.find(path_.string() + ": state file format version 7, this dsv4 reads versions 1 to 2"), std::string::npos)
      << error;
}

TEST_F(StateFile, RefusesATruncatedFile) {
  save_after(300);
  std::filesystem::resize_file(path_, std::filesystem::file_size(path_) / 2);
  const std::string error = load_error(fingerprint_);
  EXPECT_NE(error.find(path_.string() + ": layer "), std::string::npos) << error;
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
}

TEST_F(StateFile, RefusesADamagedFile) {
  save_after(300);
  overwrite_bytes(std::filesystem::file_size(path_) / 2, "\x55");
  EXPECT_EQ(load_error(fingerprint_), path_.string() + ": checksum mismatch: the file is damaged");
}

TEST_F(StateFile, RefusesAnotherModelConfig) {
  save_after(10);
  const std::unique_ptr<Model> pro = Model::load(test::fixture_model("tiny-pro"));
  const std::string error =
      load_error(state_fingerprint(pro->config(), pro->weights(), Numerics::deepseek, StateLayout::compact));
  EXPECT_NE(error.find(path_.string() + ": saved for another model, numerics or state layout: "), std::string::npos)
      << error;
  EXPECT_NE(error.find("compress_ratios"), std::string::npos) << error;
}

TEST_F(StateFile, RefusesOtherNumericsOrStateLayout) {
  save_after(10);
  const std::string prefix = path_.string() + ": saved for another model, numerics or state layout: ";
  EXPECT_EQ(load_error(fingerprint(Numerics::plain, StateLayout::compact)),
            prefix + "numerics deepseek in the file, plain here");
  EXPECT_EQ(load_error(fingerprint(Numerics::deepseek, StateLayout::f32)),
            prefix + "state layout compact in the file, f32 here");
}

TEST_F(StateFile, RefusesOtherWeightsOfTheSameShapes) {
  // Two synthetic checkpoints of tiny-flash's config that differ only in their random weights.
  save_after(10);
  std::ifstream config_file(test::fixture_model("tiny-flash") + "/config.json");
  const std::string config_text((std::istreambuf_iterator<char>(config_file)), std::istreambuf_iterator<char>());
  auto fingerprint_of_seed = [&](uint64_t seed) {
    const std::unique_ptr<Model> m = Model::from_checkpoint(model::parse_config(config_text, "config.json"),
                                                            model::synthetic_checkpoint(config_text, seed));
    return state_fingerprint(m->config(), m->weights(), Numerics::deepseek, StateLayout::compact);
  };
  const StateFingerprint a = fingerprint_of_seed(1), b = fingerprint_of_seed(2);
  ASSERT_EQ(a.fields.size(), b.fields.size());
  for (size_t i = 0; i < a.fields.size(); ++i)
    EXPECT_EQ(a.fields[i].second == b.fields[i].second, a.fields[i].first != "weights sample") << a.fields[i].first;
  const std::string error = load_error(a);
  EXPECT_NE(error.find(path_.string() + ": saved for another model, numerics or state layout: weights sample "),
            std::string::npos)
      << error;
}

TEST_F(StateFile, RestoreRefusesASnapshotThatDoesNotFitAndKeepsTheSequence) {
  SequenceState source = engine_->new_sequence();
  engine_->forward(source, tokens(0, 130), false);
  SequenceState target = engine_->new_sequence();
  engine_->forward(target, tokens(500, 7), false);
  auto expect_refused = [&](const StateSnapshot& snap, const std::string& message) {
    expect_restore_refused(target, snap, message);
    EXPECT_EQ(target.n_past, 7);
  };

  StateSnapshot short_ring = source.snapshot();
  short_ring.layers[2].ring = Buffer(engine_->backend(), short_ring.layers[2].ring.size() - 1);
  expect_refused(short_ring, "snapshot layer 2: ring of");

  // Rows of another width: the compressed rows' floats no longer match their count.
  StateSnapshot wide_rows = source.snapshot();
  const size_t il =
      size_t(std::find(model_->config().compress_ratios.begin(), model_->config().compress_ratios.end(), 4) -
             model_->config().compress_ratios.begin());
  wide_rows.layers[il].compressed = Buffer(engine_->backend(), wide_rows.layers[il].compressed.size() * 2);
  expect_refused(wide_rows, fmt::format("snapshot layer {}: compressed rows of", il));

  // A position that the compressed rows were not made at.
  StateSnapshot moved = source.snapshot();
  moved.n_past += 4;
  expect_refused(moved, "compressed rows at position 134, the sequence expects");
}

TEST_F(StateFile, RestoreRefusesAnMtpBlockPartThatDoesNotFit) {
  SequenceState source = engine_->new_sequence(true);
  engine_->forward(source, tokens(0, 130), false);
  SequenceState target = engine_->new_sequence(true);
  engine_->forward(target, tokens(500, 7), false);
  auto expect_refused = [&](const StateSnapshot& snap, const std::string& message) {
    expect_restore_refused(target, snap, message);
    EXPECT_EQ(target.n_past, 7);
    EXPECT_EQ(target.draft->pending(), 7);
  };
  StateSnapshot lost_token = source.snapshot();
  lost_token.draft->tokens.pop_back();
  expect_refused(lost_token, "snapshot MTP block at position 0 with 129 waiting, the state is at 130");
  StateSnapshot short_ring = source.snapshot();
  short_ring.draft->rings[0] = Buffer(engine_->backend(), short_ring.draft->rings[0].size() - 1);
  expect_refused(short_ring, "snapshot MTP block 0: ring of");
}

}  // namespace dsv4::engine
