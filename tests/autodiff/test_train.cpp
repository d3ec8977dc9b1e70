// Training end to end: a tiny coupled GPT memorises ~1 KB of text with AdamW; the decay mask on a
// real model's parameter list.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>

#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>

#include "helpers.hpp"

using namespace cqk_ad_test;

namespace {

// 950 characters written for this test.
const char* const kText =
    "The lighthouse keeper kept a ledger of every ship that passed the point. In spring the ledger "
    "filled with fishing boats, in summer with yachts whose sails were white as gulls, and in autumn "
    "with the slow grey freighters that carried grain down the coast. Each evening he climbed the one "
    "hundred and twelve steps, trimmed the wick, wound the clockwork that turned the lens, and wrote "
    "the date in a careful hand. Nobody ever read the ledger. The harbour master had a radio and a "
    "screen that showed every hull within forty miles, yet the keeper believed that a thing written "
    "down by a person who had watched it happen was a different kind of record. When the storm came "
    "in November and the power failed across the whole county, the screen went dark. The keeper lit "
    "the old lamp, counted the ships by their lights, and in the morning walked his ledger down to the "
    "harbour, where the master read it twice and then, without a word, poured him a cup of tea.";

}  // namespace

TEST_CASE("a tiny coupled GPT memorises ~1 KB of text (loss < 0.05 in 150 AdamW steps)") {
  const std::string text(kText);
  std::map<char, std::int32_t> id;  // the distinct characters, in byte order
  for (char c : text) id.emplace(c, 0);
  std::int32_t next = 0;
  for (auto& p : id) p.second = next++;

  GptConfig c;
  c.vocab = next;  // 30
  c.dim = 48;
  c.layers = 2;
  c.heads = 4;
  c.context = 128;
  c.dynamics_init_scale = 0.1;
  // the text as B = 7 windows of T = 128 characters; targets are the next character
  const Index T = c.context, B = static_cast<Index>((text.size() - 1) / T);
  std::vector<std::int32_t> tokens, targets;
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t) {
      tokens.push_back(id[text[static_cast<std::size_t>(b * T + t)]]);
      targets.push_back(id[text[static_cast<std::size_t>(b * T + t + 1)]]);
    }
  Gpt<float, Leapfrog<1>, Softmax> model(c, 1);
  AdamWConfig oc;
  oc.lr = 1e-2;
  oc.warmup_steps = 10;
  oc.total_steps = 150;
  AdamW<float> opt(model.parameters(), model.gradients(), oc);
  Tape<float> tape;
  const auto start = std::chrono::steady_clock::now();
  const float initial = model.evaluate(tape, tokens, targets, B);
  CHECK(initial == rel(std::log(30.0), 0.05));
  float last = 0;
  for (Index s = 0; s < oc.total_steps; ++s) {
    model.zero_grad();
    last = model.loss(tape, tokens, targets, B);
    const StepReport r = opt.step();
    REQUIRE(std::isfinite(last));
    REQUIRE(!r.skipped);
  }
  const float final_loss = model.evaluate(tape, tokens, targets, B);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("memorisation: loss ", initial, " -> ", final_loss, " (last training loss ", last, ") in ",
          oc.total_steps, " steps, ", seconds, " s, ", model.parameter_report().total, " parameters");
  CHECK(final_loss < 0.05f);
  // the integration times moved: the dynamics took part in the fit
  const float rho0 = static_cast<float>(softplus_inverse(1.0));
  CHECK((model.layer(0).params.rho.array() - rho0).abs().maxCoeff() > 1e-4f);
}

TEST_CASE("weight decay applies to exactly the 2-D tensors of a model") {
  GptConfig c;
  c.vocab = 7;
  c.dim = 8;
  c.layers = 1;
  c.heads = 2;
  c.context = 4;
  Gpt<double, Uncoupled<1>, Differential> model(c, 0);
  std::vector<std::string> decayed, kept;
  for (const auto& v : model.parameters()) (AdamW<double>::decays(v) ? decayed : kept).push_back(v.name);
  CHECK(decayed == std::vector<std::string>{"wte", "wpe", "h.0.attn.wq", "h.0.attn.wk", "h.0.attn.wv",
                                            "h.0.attn.wo", "h.0.attn.dyn.Pq1", "h.0.attn.dyn.Pk1",
                                            "h.0.attn.dyn.Pq2", "h.0.attn.dyn.Pk2", "h.0.mlp.fc.w",
                                            "h.0.mlp.proj.w"});
  CHECK(kept == std::vector<std::string>{"h.0.ln1.g", "h.0.ln1.b", "h.0.attn.dyn.pq", "h.0.attn.dyn.pk",
                                         "h.0.attn.dyn.rho", "h.0.attn.lq1", "h.0.attn.lk1", "h.0.attn.lq2",
                                         "h.0.attn.lk2", "h.0.attn.subln", "h.0.ln2.g", "h.0.ln2.b",
                                         "h.0.mlp.fc.b", "h.0.mlp.proj.b", "ln_f.g", "ln_f.b"});
  Gpt<double, Leapfrog<1>, Softmax> coupled(c, 0);
  std::vector<std::string> dyn_decayed;
  for (const auto& v : coupled.parameters())
    if (v.name.find(".dyn.") != std::string::npos && AdamW<double>::decays(v)) dyn_decayed.push_back(v.name);
  CHECK(dyn_decayed == std::vector<std::string>{"h.0.attn.dyn.W", "h.0.attn.dyn.U"});
}
