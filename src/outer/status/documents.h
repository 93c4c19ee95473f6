// The documents the head writes and others read, as typed structs (nlohmann's
// NLOHMANN_DEFINE_TYPE_*): GET /status (read by `xloco status` and the tests), one line of
// metrics/head.jsonl per round and summary.json (read by `xloco local`, the harness and the
// tests), and a head checkpoint's state.json (read by --resume). Field names are the JSON keys;
// a field added here is written and read everywhere at once. An absent optional is omitted
// from head.jsonl and written as null in /status.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nlohmann {
template <typename T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& v) { j = v ? json(*v) : json(nullptr); }
  static void from_json(const json& j, std::optional<T>& v) {
    v = j.is_null() ? std::nullopt : std::optional<T>(j.get<T>());
  }
};
}  // namespace nlohmann

namespace xloco::outer {

// One provider's line in /status.
struct ProviderStatus {
  std::string name;
  std::string address;       // as the head sees its HELLO
  std::string state;         // MemberState's name
  std::string reason;        // why it is in that state
  int up = 0;                // 1 while live
  int shard = -1;
  uint64_t last_round = 0;   // last round it contributed to
  uint64_t step = 0;         // its last inner step (heartbeats)
  uint64_t tokens = 0;
  double tokens_per_s = 0;
  double bytes_up = 0, bytes_down = 0;
  double last_seen_s = -1;   // seconds since anything came from it; -1 before its first HELLO
  // Its inner compute over the wall time between its first and its last contribution to this
  // head since it was admitted (from the compute time each contribution reports, so a claim,
  // clamped to [0, 1]); null before its second contribution.
  std::optional<double> busy;
  // outer.score: the loss change its last scored contribution caused alone (negative: it
  // helped); null when scoring is off or before its first.
  std::optional<double> score;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ProviderStatus, name, address, state, reason, up,
                                                shard, last_round, step, tokens, tokens_per_s,
                                                bytes_up, bytes_down, last_seen_s, busy, score)

// GET /status.
struct HeadStatus {
  std::string run;
  std::string state;                // waiting | running | paused | done
  std::string reason;               // what the head waits for now
  uint64_t round = 0;               // rounds done
  uint64_t round_in_progress = 0;   // 0 between rounds
  int total_rounds = 0;
  double deadline_s = 0;            // of the round in progress
  double bytes_up = 0, bytes_down = 0;
  uint64_t late_contributions = 0;
  double uptime_s = 0;
  std::string theta_pub_hash;
  std::optional<double> eval_loss;  // the last evaluation's
  std::map<std::string, uint64_t> refused;  // refusals sent, by wire code (bad_tokens, outlier…)
  uint64_t discarded_rounds = 0;    // rounds whose outer step would have made θ non-finite
  uint64_t checkpoint_failures = 0; // checkpoints that could not be written (retried)
  uint64_t write_failures = 0;      // metrics lines that could not be written (retried)
  uint64_t last_checkpoint = 0;     // round of the newest checkpoint written by this head
  std::string last_error;           // the newest failed write, for humans
  // While the run's utilization is below 95 %: what would keep the providers busy, from what
  // the head measured (outer/round/advise.h advise_run); "" otherwise.
  std::string advice;
  std::vector<ProviderStatus> providers;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(HeadStatus, run, state, reason, round,
                                                round_in_progress, total_rounds, deadline_s,
                                                bytes_up, bytes_down, late_contributions,
                                                uptime_s, theta_pub_hash, eval_loss, refused,
                                                discarded_rounds, checkpoint_failures,
                                                write_failures, last_checkpoint, last_error,
                                                advice, providers)

// One line of metrics/head.jsonl: a closed round. The optional fields (RoundRecord, below) are
// omitted when absent, so that a reader asks whether a round was evaluated, not for a null.
struct RoundFields {
  uint64_t round = 0;
  size_t participants = 0;
  uint64_t tokens = 0;                       // the contributions' tokens (time budgets vary them)
  std::string reason;                        // why it closed
  double bytes_up = 0, bytes_down = 0;       // run totals so far
  size_t update_bytes = 0;                   // the round's UPDATE frame
  double round_s = 0;                        // ROUND_START to close
  double compute_s = 0;                      // slowest participant's inner compute
  double comm_s = 0;                         // round_s − compute_s
  std::map<std::string, std::string> frames; // provider → BLAKE2b of its contribution
  double deadline_s = 0;
  uint64_t late_contributions = 0;           // run total so far
  double round_wall_s = 0;                   // ROUND_START to the next ROUND_START
  double sync_overhead = 0;                  // 1 − compute_s / round_wall_s
  std::string theta_pub_hash;                // after the update
  std::map<std::string, std::string> refused; // provider → why its contribution was refused
  std::string discarded;                     // why the round's outer step was not taken, if not
  std::map<std::string, double> clipped;     // provider → clip factor under 1 (outer.norm_clip)
  std::map<std::string, double> scores;      // provider → loss change alone (outer.score)
  int trust_scaled = 0;                      // tensors outer.trust_region scaled
  double trust_ratio = 0;                    // largest ‖lr·Δₜ‖ / trust radius, before scaling
  // The head closing it: from its close to the updates queued and θ_pub rehashed, in wall time
  // and in the CPU time of the head's loop thread (the links encrypt on their own threads).
  double close_s = 0, close_cpu_s = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RoundFields, round, participants, tokens, reason,
                                                bytes_up, bytes_down, update_bytes, round_s,
                                                compute_s, comm_s, frames, deadline_s,
                                                late_contributions, round_wall_s, sync_overhead,
                                                theta_pub_hash, refused, discarded, clipped,
                                                scores, trust_scaled, trust_ratio, close_s,
                                                close_cpu_s)
struct RoundRecord : RoundFields {
  std::optional<double> eval_loss;       // when the round was evaluated
  std::optional<double> eval_accuracy;   // cnn
  // The participants' mean training loss over the round's steps, weighted by their tokens
  // (those that reported one): not the same data or parameters as eval_loss.
  std::optional<double> train_loss;
  std::optional<std::string> eval_skipped;  // why a round due for evaluation was not
};
void to_json(nlohmann::json& j, const RoundRecord& r);
void from_json(const nlohmann::json& j, RoundRecord& r);

// summary.json, at the end of a run.
struct RunSummary {
  int rounds = 0;
  double final_eval_loss = 0;
  double bytes_up = 0, bytes_down = 0;
  double fp32_dp_bytes = 0;     // what per-step fp32 data parallel would have sent, same steps
  double bytes_vs_fp32_dp = 0;
  double wall_s = 0;
  std::string theta_pub_hash;
  int64_t head_peak_rss_bytes = 0;
  double param_bytes = 0;
  uint64_t late_contributions = 0;
  std::map<std::string, uint64_t> refused;  // as in /status
  uint64_t discarded_rounds = 0;
  uint64_t checkpoint_failures = 0;
  uint64_t write_failures = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RunSummary, rounds, final_eval_loss, bytes_up,
                                                bytes_down, fp32_dp_bytes, bytes_vs_fp32_dp,
                                                wall_s, theta_pub_hash, head_peak_rss_bytes,
                                                param_bytes, late_contributions, refused,
                                                discarded_rounds, checkpoint_failures,
                                                write_failures)

// A head checkpoint's state.json (next to model.safetensors and outer.safetensors).
struct CheckpointMember {
  int shard = -1;
  uint64_t tokens = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CheckpointMember, shard, tokens)

struct HeadCheckpointState {
  uint64_t round = 0;               // rounds done
  std::string run;
  nlohmann::json config;            // the run's config (common::to_json), for humans and tools
  std::string config_hash;          // a resume refuses a different config
  std::map<std::string, CheckpointMember> members;
  std::string theta_pub_hash;       // verified on resume
  std::string momentum_hash;        // verified on resume
  double bytes_up = 0, bytes_down = 0;
  // The norm reference (aggregate.h): by fragment index, each provider's last accepted norm.
  // Absent in checkpoints written before 2026-12-05: the first round then waits for a quorum.
  std::map<std::string, std::map<std::string, double>> norm_history;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(HeadCheckpointState, round, run, config,
                                                config_hash, members, theta_pub_hash,
                                                momentum_hash, bytes_up, bytes_down, norm_history)

// One round in GET /history (the dashboard's curves): a head.jsonl record cut to what is drawn.
struct HistoryPoint {
  uint64_t round = 0;
  uint64_t tokens = 0;                 // this round's contributions'
  size_t participants = 0;
  double bytes_up = 0, bytes_down = 0; // run totals after it
  double round_wall_s = 0;
  double compute_s = 0;                // slowest participant's
  double utilization = 0;              // compute_s / round_wall_s (1 − sync_overhead)
  std::optional<double> eval_loss;     // null when the round was not evaluated
  std::optional<double> train_loss;    // null when no participant reported one
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(HistoryPoint, round, tokens, participants,
                                                bytes_up, bytes_down, round_wall_s, compute_s,
                                                utilization, eval_loss, train_loss)
HistoryPoint history_point(const RoundRecord& r);

// A point of the single-cluster baseline's eval curve (the head's --baseline: the metrics
// JSONL of an `xloco train` run), by inner step.
struct BaselinePoint {
  int64_t step = 0;
  double eval_loss = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BaselinePoint, step, eval_loss)

// GET /run: what does not change while the head runs.
struct RunInfo {
  std::string run;
  int total_rounds = 0;
  int inner_steps = 0;       // H: round r ends at inner step r·H (the baseline's x axis)
  int providers = 0;
  nlohmann::json config;     // common::to_json
  std::string baseline_file; // "" when the run names no baseline
  std::vector<BaselinePoint> baseline;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RunInfo, run, total_rounds, inner_steps, providers,
                                                config, baseline_file, baseline)

// The eval points ({"step", "eval_loss"} lines) of an `xloco train` run's metrics JSONL;
// throws common::IoError naming the file and the line when it cannot be read or has none.
std::vector<BaselinePoint> read_baseline(const std::string& path);

// Reads a document from a file; throws common::IoError naming the file and what is wrong.
template <typename T>
T read_document(const std::string& path);
extern template HeadStatus read_document<HeadStatus>(const std::string&);
extern template RunSummary read_document<RunSummary>(const std::string&);
extern template HeadCheckpointState read_document<HeadCheckpointState>(const std::string&);

// Every line of a JSONL file of round records (a torn last line, from a crash, is skipped).
std::vector<RoundRecord> read_round_records(const std::string& path);

}  // namespace xloco::outer
