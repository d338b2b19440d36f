// `hanpu serve`'s prefix cache and scheduler (src/serve): the radix tree's lookups and LRU budget,
// and exactness on every family's tiny golden: a prefill restored from a snapshot and continued
// gives the logits of a cold prefill (fp rounding only), and the scheduler's cached requests
// generate the same greedy tokens as uncached ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hanpu/model.hpp"
#include "serve/prefix_cache.hpp"
#include "serve/scheduler.hpp"
#include "test_support.hpp"

namespace {

using namespace hanpu;
using hanpu::serve::ChoiceSignal;
using hanpu::serve::GenerationEvent;
using hanpu::serve::GenerationHandle;
using hanpu::serve::GenerationRequest;
using hanpu::serve::PrefixCache;
using hanpu::serve::Scheduler;

const char* const kFamilies[] = {"qwen35_tiny", "qwen3next_tiny", "qwen35moe_tiny", "kimi_linear_tiny",
                                 "bailing_hybrid_tiny"};

// A state whose bytes and position are all the cache looks at, for the tree tests.
HybridState fake_state(int64_t position, size_t floats) {
  HybridState s;
  s.position = position;
  s.key_cache.push_back(std::vector<float>(floats, static_cast<float>(position)));
  return s;
}

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }

TEST(ServePrefixCache, DeepestSnapshotAtOrBeforeTheSharedPrefix) {
  PrefixCache cache(1 << 20);
  const std::vector<int32_t> a = ids({1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(cache.insert(std::span(a).first(2), fake_state(2, 4)));
  ASSERT_TRUE(cache.insert(std::span(a).first(5), fake_state(5, 4)));
  // Shares 1,2,3,4,5 with a: the snapshot at 5.
  auto hit = cache.lookup(ids({1, 2, 3, 4, 5, 9}), 100);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->position, 5);
  // Shares only 1,2,3: the snapshot at 2 (a recurrent state cannot be cut back to 3).
  hit = cache.lookup(ids({1, 2, 3, 7, 8}), 100);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->position, 2);
  // max_length caps the depth (the server keeps one prompt token to compute).
  hit = cache.lookup(ids({1, 2, 3, 4, 5}), 4);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->position, 2);
  EXPECT_FALSE(cache.lookup(ids({9, 1, 2}), 100));
  // A branch splits an edge: 1,2,3,4,5 and 1,2,3,8 share 1,2,3.
  ASSERT_TRUE(cache.insert(ids({1, 2, 3, 8}), fake_state(4, 4)));
  EXPECT_EQ(cache.lookup(ids({1, 2, 3, 8, 1}), 100)->position, 4);
  EXPECT_EQ(cache.lookup(ids({1, 2, 3, 4, 5, 1}), 100)->position, 5);
  EXPECT_EQ(cache.snapshot_lengths(a), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(cache.stats().entries, 3u);
}

TEST(ServePrefixCache, EvictsLeastRecentlyUsedWithinTheBudget) {
  const size_t per = 1000 * sizeof(float);
  PrefixCache cache(3 * per + 256);  // three snapshots and their token labels
  for (int32_t i = 1; i <= 3; ++i) ASSERT_TRUE(cache.insert(ids({i, i}), fake_state(2, 1000)));
  ASSERT_TRUE(cache.lookup(ids({1, 1, 0}), 100));  // 1 is now the most recently used
  ASSERT_TRUE(cache.insert(ids({4, 4}), fake_state(2, 1000)));
  EXPECT_EQ(cache.stats().entries, 3u);
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_FALSE(cache.lookup(ids({2, 2, 0}), 100)) << "the least recently used snapshot goes first";
  EXPECT_TRUE(cache.lookup(ids({1, 1, 0}), 100));
  EXPECT_LE(cache.stats().bytes, cache.capacity_bytes());
  // Larger than the whole budget: refused, nothing evicted for it.
  EXPECT_FALSE(cache.insert(ids({5, 5}), fake_state(2, 4000)));
  EXPECT_EQ(cache.stats().entries, 3u);
  // Evicting a deep snapshot prunes its branch; the tree stays usable.
  PrefixCache small(per + 64);
  ASSERT_TRUE(small.insert(ids({1, 2, 3}), fake_state(3, 1000)));
  ASSERT_TRUE(small.insert(ids({1, 2, 3, 4, 5}), fake_state(5, 1000)));
  EXPECT_EQ(small.stats().entries, 1u);
  EXPECT_EQ(small.lookup(ids({1, 2, 3, 4, 5, 6}), 100)->position, 5);
  EXPECT_FALSE(small.insert(ids({1}), fake_state(2, 1)));  // position must match the tokens
}

std::vector<int32_t> test_prompt(const HybridModel& m, size_t n, uint64_t seed) {
  std::vector<int32_t> out(n);
  uint64_t s = seed;
  for (int32_t& id : out) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    id = static_cast<int32_t>(s % static_cast<uint64_t>(m.config().vocab_size));
  }
  return out;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  float d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::abs(a.ptr<float>()[i] - b.ptr<float>()[i]));
  return d;
}

float max_abs(const Tensor& a) {
  float d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::abs(a.ptr<float>()[i]));
  return d;
}

class ServeExactness : public ::testing::TestWithParam<const char*> {};

// Restored-and-continued equals cold: a snapshot is a full copy of the state (recurrent and conv
// states, attention KV or MLA latent rows up to its length), so the only difference from one cold
// prefill is how the prompt splits into forward() calls, i.e. fp summation order in the chunked
// engine. The bound is relative to the logits' size: 1e-4 is far above that rounding (~1e-6 seen)
// and far below any real difference (a wrong state changes logits at O(1)).
TEST_P(ServeExactness, RestoredPrefillEqualsColdPrefill) {
  const HybridModel model = HybridModel::load((hanpu::testing::golden_dir() / GetParam()).string());
  const std::vector<int32_t> prompt = test_prompt(model, 70, 7);
  const std::vector<int32_t> other = [&] {
    std::vector<int32_t> p(prompt.begin(), prompt.begin() + 48);  // shares 48 tokens, then differs
    const std::vector<int32_t> tail = test_prompt(model, 30, 99);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  }();

  HybridState cold = model.new_state();
  const Tensor cold_logits = model.forward(cold, other, {.all_logits = true});

  // The server's way: prefill `prompt` in chunks, snapshot at every 16 tokens and the end.
  PrefixCache cache(64 << 20);
  HybridState st = model.new_state();
  for (size_t at = 0; at < prompt.size(); at += 16) {
    const size_t end = std::min(prompt.size(), at + 16);
    model.forward(st, std::span(prompt).subspan(at, end - at));
    ASSERT_TRUE(cache.insert(std::span(prompt).first(end), st));
  }
  std::optional<HybridState> hit = cache.lookup(other, static_cast<int64_t>(other.size()) - 1);
  ASSERT_TRUE(hit);
  ASSERT_EQ(hit->position, 48) << "the deepest snapshot at or before the 48 shared tokens";
  const Tensor warm_logits = model.forward(*hit, std::span(other).subspan(48), {.all_logits = true});
  // Compare the rows of the continued tokens with the cold run's same positions.
  const int64_t V = model.config().vocab_size, rows = static_cast<int64_t>(other.size()) - 48;
  Tensor cold_tail(DType::F32, {rows, V});
  std::copy_n(cold_logits.ptr<float>() + 48 * V, rows * V, cold_tail.ptr<float>());
  EXPECT_LE(max_abs_diff(warm_logits, cold_tail), 1e-4f * std::max(1.0f, max_abs(cold_tail))) << GetParam();

  // Decoding on from the restored state stays equal too (the caches grew consistently).
  HybridState a = std::move(*hit), b = std::move(cold);
  for (int step = 0; step < 3; ++step) {
    const int32_t one[1] = {static_cast<int32_t>((step * 37 + 5) % V)};
    const Tensor la = model.forward(a, one), lb = model.forward(b, one);
    EXPECT_LE(max_abs_diff(la, lb), 1e-4f * std::max(1.0f, max_abs(lb))) << GetParam() << " decode step " << step;
  }
}

// The scheduler end to end: the same greedy tokens with and without a cached prefix, and the
// second request restores it.
TEST_P(ServeExactness, SchedulerCachedRequestGeneratesTheSameTokens) {
  const HybridModel model = HybridModel::load((hanpu::testing::golden_dir() / GetParam()).string());
  serve::SchedulerOptions opt;
  opt.prefill_chunk = 8;
  opt.checkpoint_every = 16;
  opt.cache_bytes = 64 << 20;
  Scheduler sched(model, nullptr, opt);
  auto run = [&](std::vector<int32_t> prompt) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = 6;
    r.sampling.temperature = 0;
    auto h = sched.submit(std::move(r));
    std::vector<int32_t> out;
    GenerationEvent ev;
    std::string finish;
    while (h->next(ev)) {
      EXPECT_NE(ev.kind, GenerationEvent::Kind::kError) << ev.error;
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.kind == GenerationEvent::Kind::kDone) finish = ev.finish_reason;
    }
    return std::make_pair(out, h->cached_tokens);
  };
  const std::vector<int32_t> base = test_prompt(model, 40, 3);
  std::vector<int32_t> longer = base;
  for (int32_t id : test_prompt(model, 9, 11)) longer.push_back(id);

  HybridState cold = model.new_state();  // reference: one cold prefill and greedy decode
  Tensor l = model.forward(cold, longer);
  std::vector<int32_t> expected;
  Sampler greedy({.temperature = 0});
  const std::vector<int32_t>& eos = model.config().eos_token_ids;
  for (int i = 0; i < 6; ++i) {
    const int32_t next = greedy.sample({l.ptr<float>(), static_cast<size_t>(model.config().vocab_size)});
    if (std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    expected.push_back(next);
    const int32_t one[1] = {next};
    l = model.forward(cold, one);
  }

  run(base);  // fills the cache: snapshots at 16, 32, 40 and after its reply
  const auto [tokens, cached] = run(longer);
  EXPECT_EQ(cached, 40) << "restores the snapshot at the first prompt's end";
  EXPECT_EQ(tokens, expected) << GetParam();
  EXPECT_EQ(sched.metrics().cache_hits.load(), 1u);
  EXPECT_EQ(sched.metrics().cache_tokens_reused.load(), 40u);
}

INSTANTIATE_TEST_SUITE_P(Families, ServeExactness, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace

namespace {

// forward_batch is the decode step of several sequences: each row equals forward() on that
// sequence alone (fp rounding only: the channel mixers and LM head see several rows at once),
// and the states advance the same way. Sequences at different positions, as in the server.
TEST_P(ServeExactness, BatchedDecodeEqualsOneSequenceAtATime) {
  const HybridModel model = HybridModel::load((hanpu::testing::golden_dir() / GetParam()).string());
  const int64_t V = model.config().vocab_size;
  std::vector<HybridState> batched, single;
  for (size_t i = 0; i < 3; ++i) {
    HybridState st = model.new_state();
    model.forward(st, test_prompt(model, 5 + 7 * i, 20 + i));
    batched.push_back(st);
    single.push_back(std::move(st));
  }
  for (int step = 0; step < 4; ++step) {
    std::vector<HybridState*> states;
    std::vector<int32_t> next;
    for (size_t i = 0; i < batched.size(); ++i) {
      states.push_back(&batched[i]);
      next.push_back(static_cast<int32_t>((31 * step + 11 * i + 3) % V));
    }
    const Tensor rows = model.forward_batch(states, next);
    ASSERT_EQ(rows.shape(), (std::vector<int64_t>{3, V}));
    for (size_t i = 0; i < single.size(); ++i) {
      const int32_t one[1] = {next[i]};
      const Tensor ref = model.forward(single[i], one);
      Tensor row(DType::F32, {1, V});
      std::copy_n(rows.ptr<float>() + static_cast<int64_t>(i) * V, V, row.ptr<float>());
      EXPECT_LE(max_abs_diff(row, ref), 1e-4f * std::max(1.0f, max_abs(ref))) << GetParam() << " step " << step << " row " << i;
      EXPECT_EQ(batched[i].position, single[i].position);
    }
  }
  EXPECT_THROW(model.forward_batch(std::vector<HybridState*>{&batched[0]}, std::vector<int32_t>{1, 2}), Error);
  EXPECT_THROW(model.forward_batch(std::vector<HybridState*>{&batched[0]}, std::vector<int32_t>{static_cast<int32_t>(V)}), Error);
}

// Several requests at once decode as one batch and still give each one its own greedy tokens.
TEST_P(ServeExactness, ConcurrentRequestsDecodeBatchedWithTheirOwnTokens) {
  const HybridModel model = HybridModel::load((hanpu::testing::golden_dir() / GetParam()).string());
  std::vector<std::vector<int32_t>> prompts, alone;
  for (uint64_t i = 0; i < 4; ++i) prompts.push_back(test_prompt(model, 6 + 5 * i, 40 + i));
  auto collect = [](const std::shared_ptr<serve::GenerationHandle>& h) {
    std::vector<int32_t> out;
    GenerationEvent ev;
    while (h->next(ev)) {
      EXPECT_NE(ev.kind, GenerationEvent::Kind::kError) << ev.error;
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    }
    return out;
  };
  auto request = [&](const std::vector<int32_t>& p) {
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = 8;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    return r;
  };
  serve::SchedulerOptions opt;
  opt.cache_bytes = 0;
  {
    Scheduler one_by_one(model, nullptr, opt);
    for (const auto& p : prompts) alone.push_back(collect(one_by_one.submit(request(p))));
  }
  Scheduler sched(model, nullptr, opt);
  std::vector<std::shared_ptr<serve::GenerationHandle>> handles;
  for (const auto& p : prompts) handles.push_back(sched.submit(request(p)));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(collect(handles[i]), alone[i]) << GetParam() << " request " << i;
  EXPECT_LT(sched.metrics().decode_steps.load(), sched.metrics().decode_tokens.load()) << "some steps were batched";
}

}  // namespace

namespace {

// The tokens of every event of a handle, and the finish reason.
std::pair<std::vector<int32_t>, std::string> drain_handle(serve::GenerationHandle& h) {
  std::vector<int32_t> out;
  std::string finish;
  GenerationEvent ev;
  while (h.next(ev)) {
    EXPECT_NE(ev.kind, GenerationEvent::Kind::kError) << ev.error;
    out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.kind == GenerationEvent::Kind::kDone) finish = ev.finish_reason;
  }
  return {out, finish};
}

}  // namespace

TEST(ServePrefixCache, SharedPrefixCountsTokensInsideEdgesAndWithoutSnapshots) {
  PrefixCache cache(1 << 20);
  EXPECT_EQ(cache.shared_prefix(ids({1, 2})), 0);
  ASSERT_TRUE(cache.insert(ids({1, 2, 3, 4, 5, 6}), fake_state(6, 4)));
  EXPECT_EQ(cache.shared_prefix(ids({1, 2, 3, 9})), 3);  // inside the edge
  EXPECT_EQ(cache.shared_prefix(ids({1, 2, 3, 4, 5, 6, 7})), 6);
  EXPECT_EQ(cache.shared_prefix(ids({1, 2})), 2);        // the query ends inside the edge
  EXPECT_EQ(cache.shared_prefix(ids({7})), 0);
  ASSERT_TRUE(cache.insert(ids({1, 2, 8}), fake_state(3, 4)));  // splits the edge at 2
  EXPECT_EQ(cache.shared_prefix(ids({1, 2, 8, 1})), 3);
  EXPECT_EQ(cache.shared_prefix(ids({1, 2, 3, 4, 0})), 4);
}

// n choices: the prompt is prefilled once; choice i samples with seed + i from a copy of its
// state, so it gives exactly what a request of its own with that seed gives.
TEST_P(ServeExactness, ChoicesEqualSingleRequestsWithTheNextSeeds) {
  const HybridModel model = HybridModel::load((hanpu::testing::golden_dir() / GetParam()).string());
  serve::SchedulerOptions opt;
  opt.prefill_chunk = 8;
  opt.cache_bytes = 0;  // no cache: the singles must not profit from the choices' snapshots
  Scheduler sched(model, nullptr, opt);
  GenerationRequest r;
  r.prompt = test_prompt(model, 21, 5);
  r.max_tokens = 7;
  r.ignore_eos = true;
  r.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 99};
  r.n = 3;
  auto handles = sched.submit_choices(r);
  ASSERT_EQ(handles.size(), 3u);
  std::vector<std::vector<int32_t>> together;
  for (auto& h : handles) together.push_back(drain_handle(*h).first);
  EXPECT_EQ(sched.metrics().prefill_tokens.load(), 21u) << "the prompt is computed once for all choices";
  for (int i = 0; i < 3; ++i) {
    GenerationRequest one = r;
    one.n = 1;
    one.sampling.seed = 99 + static_cast<uint64_t>(i);
    auto h = sched.submit(one);
    EXPECT_EQ(drain_handle(*h).first, together[static_cast<size_t>(i)]) << GetParam() << " choice " << i;
    EXPECT_EQ(together[static_cast<size_t>(i)].size(), 7u);
  }
  EXPECT_NE(together[0], together[1]);
}

GenerationEvent delta(const std::string& text) {
  GenerationEvent e;
  e.text = text;
  return e;
}

GenerationEvent done() {
  GenerationEvent e;
  e.kind = GenerationEvent::Kind::kDone;
  e.finish_reason = "stop";
  return e;
}

// next_of_any (the stream of n choices): round-robin over the choices from the one after the
// last served, so a choice with many queued events does not hold back the others; handles.size()
// once all ended; handles.size() + 1 after the timeout; a push from another thread wakes it.
TEST(ServeChoices, NextOfAnyTakesTheChoicesInTurnAndWakesOnAPush) {
  auto signal = std::make_shared<ChoiceSignal>();
  std::vector<std::shared_ptr<GenerationHandle>> h{std::make_shared<GenerationHandle>(signal),
                                                   std::make_shared<GenerationHandle>(signal)};
  for (const char* t : {"a0", "a1", "a2"}) h[0]->push(delta(t));
  h[1]->push(delta("b0"));
  GenerationEvent ev;
  const auto ms = std::chrono::milliseconds(50);
  std::vector<std::string> order;
  size_t from = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t c = hanpu::serve::next_of_any(h, from, ev, ms);
    ASSERT_LT(c, 2u);
    order.push_back(ev.text);
    from = (c + 1) % 2;
  }
  EXPECT_EQ(order, (std::vector<std::string>{"a0", "b0", "a1", "a2"}));
  EXPECT_EQ(hanpu::serve::next_of_any(h, from, ev, ms), 3u) << "nothing queued: the timeout";
  std::thread pusher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    h[1]->push(delta("b1"));
  });
  const size_t c = hanpu::serve::next_of_any(h, 0, ev, std::chrono::seconds(30));
  pusher.join();
  EXPECT_EQ(c, 1u);
  EXPECT_EQ(ev.text, "b1");
  h[0]->push(done());
  h[1]->push(done());
  EXPECT_EQ(hanpu::serve::next_of_any(h, 0, ev, ms), 0u);
  EXPECT_EQ(ev.kind, GenerationEvent::Kind::kDone);
  EXPECT_EQ(hanpu::serve::next_of_any(h, 0, ev, ms), 1u);
  EXPECT_EQ(hanpu::serve::next_of_any(h, 0, ev, ms), 2u) << "every choice ended";
  // Handles of different requests cannot be read together.
  std::vector<std::shared_ptr<GenerationHandle>> mixed{h[0], std::make_shared<GenerationHandle>()};
  EXPECT_THROW(hanpu::serve::next_of_any(mixed, 0, ev, ms), Error);
}

// The scheduler's choices decode in one batch, so read with next_of_any (as the server's stream
// reads them) every choice's first delta comes before any choice ends: read one after another,
// choices 1 and 2 would start only after choice 0's end. Each choice's tokens, taken apart, are
// what reading the same request choice by choice gives.
TEST(ServeChoices, ChoicesStreamInterleaved) {
  const HybridModel model = HybridModel::load((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  serve::SchedulerOptions opt;
  opt.prefill_chunk = 8;
  opt.cache_bytes = 0;
  Scheduler sched(model, nullptr, opt);
  GenerationRequest r;
  r.prompt = test_prompt(model, 13, 3);
  r.max_tokens = 9;
  r.ignore_eos = true;
  r.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 5};
  r.n = 3;
  auto handles = sched.submit_choices(r);
  ASSERT_EQ(handles.size(), 3u);
  std::vector<std::vector<int32_t>> tokens(3);
  std::vector<size_t> order;  // choice of each delta, in the order read
  size_t first_done = SIZE_MAX, from = 0;
  for (;;) {
    GenerationEvent ev;
    const size_t c = hanpu::serve::next_of_any(handles, from, ev, std::chrono::seconds(120));
    ASSERT_NE(c, 4u) << "timed out";
    if (c == 3) break;
    from = (c + 1) % 3;
    ASSERT_NE(ev.kind, GenerationEvent::Kind::kError) << ev.error;
    if (ev.kind == GenerationEvent::Kind::kDone && first_done == SIZE_MAX) first_done = order.size();
    if (ev.kind == GenerationEvent::Kind::kDelta) {
      order.push_back(c);
      tokens[c].insert(tokens[c].end(), ev.tokens.begin(), ev.tokens.end());
    }
  }
  ASSERT_NE(first_done, SIZE_MAX);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(tokens[c].size(), 9u) << "choice " << c;
    const size_t first = static_cast<size_t>(std::find(order.begin(), order.end(), c) - order.begin());
    EXPECT_LT(first, first_done) << "choice " << c << " started only after a choice ended: not interleaved";
  }
  // The same request read choice by choice gives the same tokens.
  auto again = sched.submit_choices(r);
  for (size_t c = 0; c < 3; ++c) EXPECT_EQ(drain_handle(*again[c]).first, tokens[c]) << "choice " << c;
}

// A warm_only request computes and snapshots its prompt and nothing else; a request that then
// extends it restores all of it and generates what a cold one does.
TEST_P(ServeExactness, WarmOnlySnapshotIsRestoredExactly) {
  const HybridModel model = HybridModel::load((hanpu::testing::golden_dir() / GetParam()).string());
  serve::SchedulerOptions opt;
  opt.prefill_chunk = 8;
  opt.checkpoint_every = 0;
  opt.cache_bytes = 64 << 20;
  Scheduler sched(model, nullptr, opt);
  GenerationRequest warm;
  warm.prompt = test_prompt(model, 19, 8);
  warm.max_tokens = 0;
  warm.warm_only = true;
  auto w = sched.submit(warm);
  const auto [none, why] = drain_handle(*w);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(sched.cache().snapshot_lengths(warm.prompt), (std::vector<int64_t>{19}));
  EXPECT_EQ(sched.metrics().warm_requests.load(), 1u);
  // Again: a snapshot of the whole prompt is there, nothing to compute.
  const uint64_t computed = sched.metrics().prefill_tokens.load();
  drain_handle(*sched.submit(warm));
  EXPECT_EQ(sched.metrics().prefill_tokens.load(), computed);

  GenerationRequest next;
  next.prompt = warm.prompt;
  for (int32_t id : test_prompt(model, 5, 30)) next.prompt.push_back(id);
  next.max_tokens = 5;
  next.sampling.temperature = 0;
  auto h = sched.submit(next);
  const auto hot = drain_handle(*h).first;
  EXPECT_EQ(h->cached_tokens, 19);
  EXPECT_EQ(h->cache_result, "hit");
  serve::SchedulerOptions cold_opt = opt;
  cold_opt.cache_bytes = 0;
  Scheduler cold(model, nullptr, cold_opt);
  auto c = cold.submit(next);
  EXPECT_EQ(drain_handle(*c).first, hot) << GetParam();
  EXPECT_EQ(c->cache_result, "miss");
}

// Logprobs: the log-softmax of the logits at the chosen token, and the top alternatives in order.
TEST(ServeScheduler, LogprobsAreTheLogSoftmaxOfTheLogits) {
  const HybridModel model = HybridModel::load((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  serve::SchedulerOptions opt;
  opt.cache_bytes = 0;
  Scheduler sched(model, nullptr, opt);
  GenerationRequest r;
  r.prompt = test_prompt(model, 9, 2);
  r.max_tokens = 3;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.top_logprobs = 5;
  auto h = sched.submit(r);
  std::vector<serve::TokenLogprob> lps;
  std::vector<int32_t> tokens;
  GenerationEvent ev;
  while (h->next(ev)) {
    lps.insert(lps.end(), ev.logprobs.begin(), ev.logprobs.end());
    tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end());
  }
  ASSERT_EQ(lps.size(), 3u);
  HybridState st = model.new_state();
  Tensor l = model.forward(st, r.prompt);
  const size_t V = static_cast<size_t>(model.config().vocab_size);
  for (size_t i = 0; i < 3; ++i) {
    const float* row = l.ptr<float>();
    double mx = -1e300, sum = 0;
    for (size_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    for (size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    const double log_z = mx + std::log(sum);
    EXPECT_EQ(lps[i].token, tokens[i]);
    EXPECT_NEAR(lps[i].logprob, row[tokens[i]] - log_z, 1e-5);
    ASSERT_EQ(lps[i].top.size(), 5u);
    EXPECT_EQ(lps[i].top[0].first, tokens[i]) << "greedy picks the most likely token";
    for (size_t k = 1; k < 5; ++k) EXPECT_GE(lps[i].top[k - 1].second, lps[i].top[k].second);
    for (const auto& [id, lp] : lps[i].top) EXPECT_NEAR(lp, row[id] - log_z, 1e-5);
    const int32_t one[1] = {tokens[i]};
    l = model.forward(st, one);
  }
}
