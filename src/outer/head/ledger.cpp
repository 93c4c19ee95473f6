#include "outer/head/ledger.h"
#include "common/json_text.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "outer/round/advise.h"

namespace xloco::outer {
RunLedger::RunLedger(const common::Config& config, const std::string& run_dir,
                     std::function<void(const RoundRecord&)> written)
    : config_(config), total_(common::total_rounds(config)),
      metrics_path_((std::filesystem::path(run_dir) / "metrics" / "head.jsonl").string()),
      written_(std::move(written)) {}

void RunLedger::count_up(Member& m, size_t bytes) {
  m.bytes_up += static_cast<double>(bytes);
  summary_.bytes_up += static_cast<double>(bytes);
}

void RunLedger::count_down(Member& m, size_t bytes) {
  m.bytes_down += static_cast<double>(bytes);
  summary_.bytes_down += static_cast<double>(bytes);
}

void RunLedger::announce() const {
  const auto& o = config_.outer;
  spdlog::info("head: run {} | {} rounds of H={} | codec up {} down {} | outer lr {}{} | waiting for {} "
               "providers",
               config_.run.name, total_, o.inner_steps, common::to_string(o.codec_up),
               o.downlink == common::Downlink::kRelay ? "relay" : common::to_string(o.codec_down), o.lr,
               o.lr_end >= 0 ? fmt::format(" falling to {} at the last round", o.lr_end) : "",
               o.providers);
  if (o.downlink == common::Downlink::kRelay && o.relay_mean == common::RelayMean::kPresent) {
    spdlog::warn("outer.relay_mean \"present\": an element only one provider sent moves by its whole "
                 "(clipped) value, not 1/K of it; with providers you do not trust use \"clipped\" or "
                 "\"all\" (README, threat model)");
  }
  if (o.downlink == common::Downlink::kRelay) {
    const std::string w = relay_download_warning(o.providers, common::to_string(o.codec_up), o.topk,
                                                 o.block_size);
    if (!w.empty()) spdlog::warn("{}", w);
  }
  if (o.norm_bound <= 0) {
    spdlog::warn("outer.norm_bound is 0: contributions' norms are neither judged nor clipped; one "
                 "provider can move theta as far as it likes (README, threat model)");
  }
}

double RunLedger::uptime_s() const { return seconds_since(started_); }

RoundRecord RunLedger::close_round(const RoundState& round, const std::string& reason,
                                   Members& members, size_t update_bytes) {
  RoundRecord rec;
  rec.round = round.round;
  rec.participants = round.contributed.size();
  rec.reason = reason;
  rec.update_bytes = update_bytes;
  rec.round_s = seconds_since(round.started);
  double loss_sum = 0, loss_weight = 0;
  for (const auto& [p, tokens] : round.contributed) {
    Member& m = members[p];
    m.tokens += tokens;
    m.last_round = round.round;
    rec.tokens += tokens;
    rec.compute_s = std::max(rec.compute_s, m.compute_s);
    if (m.train_loss >= 0 && std::isfinite(m.train_loss)) {
      const double w = std::max<double>(1, static_cast<double>(tokens));
      loss_sum += w * m.train_loss;
      loss_weight += w;
    }
  }
  if (loss_weight > 0) rec.train_loss = loss_sum / loss_weight;
  rec.comm_s = std::max(0.0, rec.round_s - rec.compute_s);
  rec.frames = frames_;
  rec.refused = round_refused_;
  rec.deadline_s = round.deadline_s;
  rec.bytes_up = summary_.bytes_up;
  rec.bytes_down = summary_.bytes_down;
  rec.late_contributions = late_contributions_;
  return rec;
}

void RunLedger::write_round(RoundRecord record, bool await_eval, bool await_hash) {
  held_.push_back({std::move(record), await_eval, await_hash});
  flush();
}

void RunLedger::record_eval(uint64_t round, double loss, std::optional<double> accuracy) {
  for (auto& h : held_) {
    if (h.record.round != round) continue;
    h.await_eval = false;
    h.record.eval_loss = last_eval_ = summary_.final_eval_loss = loss;
    h.record.eval_accuracy = accuracy;
  }
  flush();
}

void RunLedger::skip_eval(uint64_t round, const std::string& why) {
  spdlog::warn("evaluation of round {} skipped: {}", round, why);
  for (auto& h : held_) {
    if (h.record.round != round) continue;
    h.await_eval = false;
    h.record.eval_skipped = why;
  }
  flush();
}

void RunLedger::record_hash(uint64_t round, const std::string& hash) {
  for (auto& h : held_) {
    if (h.record.round != round) continue;
    h.await_hash = false;
    h.record.theta_pub_hash = hash;
  }
  flush();
}

void RunLedger::checkpoint_failed(const std::string& why) {
  ++summary_.checkpoint_failures;
  last_error_ = why;
}

// Complete records go to head.jsonl in order. One that cannot be written (a full disk) stays,
// with those after it, until the next record's write; nothing is lost while the head runs.
void RunLedger::flush() {
  while (!held_.empty() && !held_.front().await_eval && !held_.front().await_hash) {
    const RoundRecord& rec = held_.front().record;
    try {
      if (!metrics_.is_open()) metrics_.open(metrics_path_);
      metrics_.write(rec);
    } catch (const common::Error& e) {
      ++summary_.write_failures;
      last_error_ = e.what();
      spdlog::error("round {}: {} ({} records wait to be written; retried at the next round)",
                    rec.round, e.what(), held_.size());
      return;
    }
    log_round(rec);
    if (written_) written_(rec);
    held_.pop_front();
  }
}

void RunLedger::log_round(const RoundRecord& rec) {
  const uint64_t done_rounds = rec.round;
  const double per_round = uptime_s() / static_cast<double>(done_rounds - resumed_from_);
  spdlog::info("round {}/{} | {} providers | {} up | {} down | round {:.2f}s {}| ETA {}", done_rounds,
               total_, rec.participants, common::human_bytes(summary_.bytes_up),
               common::human_bytes(summary_.bytes_down), rec.round_s,
               rec.eval_loss ? fmt::format("| eval {:.4f} ", *rec.eval_loss) : "",
               common::human_duration(per_round * static_cast<double>(total_ - static_cast<int>(done_rounds))));
}

HeadStatus RunLedger::status(const std::string& state, const std::string& reason,
                             uint64_t done_rounds, const RoundState* open, const Members& members,
                             const std::string& pub_hash) const {
  HeadStatus s;
  s.run = config_.run.name;
  s.state = state;
  s.reason = reason;
  s.round = done_rounds;
  s.round_in_progress = open ? open->round : 0;
  s.total_rounds = total_;
  s.deadline_s = open ? open->deadline_s : 0.0;
  s.bytes_up = summary_.bytes_up;
  s.bytes_down = summary_.bytes_down;
  s.late_contributions = late_contributions_;
  s.uptime_s = uptime_s();
  s.theta_pub_hash = pub_hash;
  s.eval_loss = last_eval_;
  s.refused = summary_.refused;
  s.discarded_rounds = summary_.discarded_rounds;
  s.checkpoint_failures = summary_.checkpoint_failures;
  s.write_failures = summary_.write_failures;
  s.last_checkpoint = last_checkpoint_;
  s.last_error = last_error_;
  s.providers = provider_statuses(members, Clock::now());
  return s;
}

void RunLedger::note_utilization(double u) {
  if (!std::isfinite(u)) return;
  utilization_.push_back(std::clamp(u, 0.0, 1.0));
  if (utilization_.size() > 3) utilization_.pop_front();
}

std::string RunLedger::advice(const Members& members, double params) const {
  RunMeasured m;
  m.rounds = static_cast<int>(utilization_.size());
  if (m.rounds == 0) return "";
  m.utilization = 0;
  for (double u : utilization_) m.utilization += u / m.rounds;
  m.params = params;
  m.inner_steps = config_.outer.inner_steps;
  m.codec_up = common::to_string(config_.outer.codec_up);
  m.codec_down = common::to_string(config_.outer.codec_down);
  for (const auto& [name, mem] : members) {
    if (!is_live(mem.state) || mem.link_s < 0 || mem.frame_bytes <= 0) continue;
    m.providers.push_back({name, mem.compute_s, mem.link_s, mem.frame_bytes});
  }
  try {
    return advise_run(m);
  } catch (const common::Error& e) {  // a measurement the rule refuses: no advice, and why
    return fmt::format("no advice: {}", e.what());
  }
}

HeadCheckpointState RunLedger::checkpoint_state(uint64_t done_rounds, const Members& members) const {
  HeadCheckpointState st;
  st.round = done_rounds;
  st.run = config_.run.name;
  st.config = common::to_json(config_);
  st.config_hash = common::config_hash(config_);
  for (const auto& [name, m] : members) st.members[name] = {m.shard, m.tokens};
  st.bytes_up = summary_.bytes_up;
  st.bytes_down = summary_.bytes_down;
  return st;
}

void RunLedger::restore(const HeadCheckpointState& st, Members& members) {
  resumed_from_ = st.round;
  summary_.bytes_up = st.bytes_up;
  summary_.bytes_down = st.bytes_down;
  for (const auto& [name, m] : st.members) {
    members[name].shard = m.shard;
    members[name].tokens = m.tokens;
  }
}

const RunSummary& RunLedger::finish(uint64_t done_rounds, const std::string& pub_hash,
                                    double param_bytes, const std::string& path) {
  RunSummary& s = summary_;
  s.rounds = static_cast<int>(done_rounds);
  s.wall_s = uptime_s();
  s.theta_pub_hash = pub_hash;
  s.param_bytes = param_bytes;
  s.fp32_dp_bytes = 2.0 * param_bytes * config_.inner.steps * config_.outer.providers;
  s.bytes_vs_fp32_dp = (s.bytes_up + s.bytes_down) / s.fp32_dp_bytes;
  s.late_contributions = late_contributions_;
  s.head_peak_rss_bytes = common::peak_rss_bytes();
  flush();
  try {
    common::write_file_atomic(path, common::json_dump(nlohmann::json(s), 2) + "\n");
  } catch (const common::Error& e) {
    ++s.write_failures;
    spdlog::error("summary not written: {}", e.what());
  }
  spdlog::info("done: {} rounds, final eval loss {:.4f}, {} up, {} down ({:.5f} of fp32 data "
               "parallel), theta_pub {}",
               s.rounds, s.final_eval_loss, common::human_bytes(s.bytes_up),
               common::human_bytes(s.bytes_down), s.bytes_vs_fp32_dp, s.theta_pub_hash);
  return s;
}

}  // namespace xloco::outer
