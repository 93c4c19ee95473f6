// The head's account of a run (design §8): byte and contribution counters, the last
// evaluation, and the typed documents made from them (documents.h) — one metrics/head.jsonl
// line per round, /status, summary.json, a checkpoint's state.json. It decides nothing and does
// no network I/O; the head feeds it as rounds close.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <vector>
#include <optional>
#include <string>

#include "common/config.h"
#include "common/metrics.h"
#include "outer/head/membership.h"
#include "outer/round/round.h"
#include "outer/status/documents.h"

namespace xloco::outer {

class RunLedger {
 public:
  // `written` (optional) sees every round record as it is written.
  RunLedger(const common::Config& config, const std::string& run_dir,
            std::function<void(const RoundRecord&)> written = {});
  void announce() const;  // the run's first log line

  void count_up(Member& m, size_t bytes);
  void count_down(Member& m, size_t bytes);
  void count_late() { ++late_contributions_; }
  // A refusal sent (any message), by its wire code; a contribution's also goes in its round's
  // record with the reason.
  void count_refusal(const std::string& code) { ++summary_.refused[code]; }
  void note_refused_contribution(const std::string& peer, const std::string& why) {
    round_refused_[peer] = why;
  }
  void count_discarded() { ++summary_.discarded_rounds; }
  // Checkpoint writes: a failure is counted and remembered for /status; the head retries.
  void checkpoint_failed(const std::string& why);
  void checkpoint_written(uint64_t round) { last_checkpoint_ = round; }
  void note_frame(const std::string& peer, const std::string& hash) { frames_[peer] = hash; }
  void forget_frame(const std::string& peer) { frames_.erase(peer); }
  void new_round() {
    frames_.clear();
    round_refused_.clear();
  }

  // The record of a round that just closed with `round.contributed`; credits their tokens.
  RoundRecord close_round(const RoundState& round, const std::string& reason, Members& members,
                          size_t update_bytes);
  // Appends a closed round's record to head.jsonl and logs it, once it is complete: a record
  // waits for the evaluation of its round (`await_eval`) and for θ_pub's hash after its update
  // (`await_hash`, while an evaluation holds the update back), and records stay in order.
  void write_round(RoundRecord record, bool await_eval, bool await_hash);
  // The evaluation of `round`, or why there is none (logged), and θ_pub's hash after `round`.
  void record_eval(uint64_t round, double loss, std::optional<double> accuracy);
  void skip_eval(uint64_t round, const std::string& why);
  void record_hash(uint64_t round, const std::string& hash);

  HeadStatus status(const std::string& state, const std::string& reason, uint64_t done_rounds,
                    const RoundState* open, const Members& members,
                    const std::string& pub_hash) const;

  // A closed round's utilization (compute / round wall), kept for the advice.
  void note_utilization(double u);
  // The advice /status shows (outer/round/advise.h advise_run) from the members' measurements and
  // the last rounds' utilization; "" while the run is at or above 95 %.
  std::string advice(const Members& members, double params) const;

  HeadCheckpointState checkpoint_state(uint64_t done_rounds, const Members& members) const;
  // Counters and member shards and tokens from a checkpoint.
  void restore(const HeadCheckpointState& state, Members& members);
  uint64_t resumed_from() const { return resumed_from_; }
  const std::string& metrics_path() const { return metrics_path_; }  // RUN_DIR/metrics/head.jsonl

  // Writes summary.json (to `path`) and logs the end of the run.
  const RunSummary& finish(uint64_t done_rounds, const std::string& pub_hash, double param_bytes,
                           const std::string& path);
  const RunSummary& summary() const { return summary_; }
  double uptime_s() const;


 private:
  const common::Config& config_;
  const int total_;
  const Clock::time_point started_ = Clock::now();
  const std::string metrics_path_;  // appended to from the first round closed
  common::JsonlWriter metrics_;
  RunSummary summary_;  // bytes_up/down are the running totals
  uint64_t late_contributions_ = 0, resumed_from_ = 0;
  std::optional<double> last_eval_;
  std::map<std::string, std::string> frames_;  // provider → BLAKE2b of its contribution
  std::map<std::string, std::string> round_refused_;  // provider → why, this round
  uint64_t last_checkpoint_ = 0;
  std::string last_error_;
  struct Held {
    RoundRecord record;
    bool await_eval = false, await_hash = false;
  };
  std::deque<Held> held_;  // closed rounds whose records are not complete or not written yet
  std::deque<double> utilization_;  // the last 3 closed rounds', for the advice
  void flush();
  std::function<void(const RoundRecord&)> written_;
  void log_round(const RoundRecord& record);  // its progress line
};

}  // namespace xloco::outer
