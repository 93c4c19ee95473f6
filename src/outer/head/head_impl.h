// The head's state and its event handlers (head.h for what it does): the loop, the rounds
// and the background work in head.cpp, what each message and each verdict leads to in
// head_messages.cpp. Private to those two files.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/log_limit.h"
#include "net/protocol.h"
#include "net/transport.h"
#include "outer/head/global_model.h"
#include "outer/head/head.h"
#include "outer/head/ledger.h"
#include "outer/head/membership.h"
#include "outer/round/round.h"
#include "outer/status/status_http.h"

namespace xloco::outer {

struct Head::Impl {
  common::Config cfg;
  HeadOptions opts;
  std::unique_ptr<net::Transport> net;
  GlobalModel model;
  Members members;
  RoundState round;
  bool in_round = false, first_round = true;
  uint64_t done_rounds = 0;
  const int total;
  RunLedger ledger;
  std::string last_wait_reason;
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last_heartbeat = t0, last_publish{}, last_listen = t0, listening_since = t0;
  std::unique_ptr<StatusServer> status;
  std::atomic<bool> stop_requested{false};
  std::optional<uint64_t> eval_due;  // a closed round to evaluate once θ_pub holds it
  bool checkpoint_due = false;       // waits while an evaluation holds an update back
  std::optional<uint64_t> checkpoint_failed_at;
  common::LogLimiter warnings{10, 60};  // refusals a peer provokes, by peer and code
  common::LogLimiter reports{3, 60};    // ERROR and BYE texts a peer sends, by peer

  // head.cpp: start-up (resume or not), the loop, rounds, evaluation, checkpoints, the end.
  Impl(const common::Config& c, HeadOptions o, std::unique_ptr<net::Transport> t);
  int run();
  std::string ckpt_root() const { return opts.run_dir + "/ckpt"; }
  bool checkpoint();  // false: not written (logged and counted)
  void try_start_round();
  void start_round();
  void close_round(const std::string& reason);
  // The round's update to every live member (update_for: relay leaves each one's own out).
  void send_update(const net::Update& update);
  // What the close says beyond the ledger's record: θ_pub's hash, refusals, clips, scores.
  void note_closed(const GlobalModel::Closed& closed, RoundRecord& rec);
  // Starts and collects evaluations, and writes a checkpoint that waited for θ_pub.
  void background();
  void evaluated(const GlobalModel::Evaluation& e);
  // Liveness (unless the head was not listening), heartbeats, the status snapshot.
  void housekeeping();
  void publish_status(const std::string& state);
  void broadcast(const net::Body& body);
  void finish();
  // Lets what is queued for the live providers (the last update, BYE) leave before the head
  // does: until every queue is empty, none has moved for outer.dead_after_s, or `limit_s`.
  void drain(double limit_s);

  // head_messages.cpp: carrying out verdicts, and what each message leads to.
  // Queues a message; a peer that is gone, or whose queue is over its budget, is dead.
  bool send(const std::string& peer, net::Body body, uint64_t r);  // false: not queued
  void refuse(const std::string& peer, net::RefusalCode code, const std::string& why);
  void set_state(const Transition& t);
  // A provider that has not contributed to the round in progress will not: it left, died, or
  // (re)joined and takes part from the next round. Work it already handed in counts.
  void leave_round(const std::string& peer, bool faulted = false);
  // Contributions whose frames failed to decode when their turn came.
  void reject(const std::vector<Aggregator::Rejected>& rejected);
  // Every message passes through handle(), a boundary (design §10): whatever a handler throws
  // is caught, the sender refused as malformed (counted) and the head carries on.
  void handle(const net::Received& rx);
  void dispatch(const net::Received& rx);
  void on_hello(const std::string& peer, const net::Hello& h, const std::string& address);
  void on_contribution(const std::string& peer, uint64_t r, const net::Contribution& c);
};

}  // namespace xloco::outer
