#include "core/membership.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

namespace hora {

namespace {

using std::chrono::milliseconds;

std::string round(int64_t epoch) { return "r" + std::to_string(epoch) + "/"; }

// An integer key the launcher or a peer wrote; `fallback` when absent.
Result<int64_t> readInt(Store& el, const std::string& key, int64_t fallback) {
  auto present = el.check(key);
  if (!present.isOk()) return present.status();
  if (!present.value()) return fallback;
  auto v = el.get(key, milliseconds(1000));
  if (!v.isOk()) return v.status();
  try {
    return static_cast<int64_t>(std::stoll(v.value()));
  } catch (const std::exception&) {
    return protocolError("store key hora/el/" + key + " holds '" + v.value() +
                         "', not an integer (a launcher writing another format?)");
  }
}

Result<bool> isDead(Store& el, const std::string& workerId) { return el.check("dead/" + workerId); }

struct Ticket {
  int64_t number = 0;
  std::string workerId, host;
  int64_t lastEpoch = -1;
  int lastRank = -1;
  bool survivor = false;  // a member of the last formed epoch
  std::string settings;
};

bool parseTicket(const std::string& text, Ticket* t) {
  std::istringstream is(text);
  std::string kind;
  if (!(is >> t->workerId >> t->lastEpoch >> t->lastRank >> t->host >> kind >> t->settings))
    return false;
  t->survivor = kind == "S";
  return kind == "S" || kind == "N";
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

// The leader of epoch `target` decides who is in it: it waits until every
// live member of the previous epoch arrived (or, not knowing them, as many
// workers as the launcher reports alive), or until no one arrived for the
// settle time, then lists survivors by their old rank and newcomers by
// arrival.
Status lead(Store& el, int64_t target, const FormRequest& req, Clock::time_point deadline,
            const Logger& logger) {
  const std::string r = round(target);
  const std::vector<std::string> previous = membersOf(el, target - 1);
  auto lastChange = Clock::now();
  int64_t seen = 0;
  std::map<int64_t, Ticket> tickets;  // by number; workerId empty when unreadable
  auto minNp = readInt(el, "min_np", 1);
  if (!minNp.isOk()) return minNp.status();
  for (;;) {
    auto n = el.add(r + "arrivals", 0);
    if (!n.isOk()) return n.status();
    if (n.value() != seen) seen = n.value(), lastChange = Clock::now();
    // Who is here and alive. A ticket never changes once written: each is
    // read once (one an arrival died before writing stays missing).
    for (int64_t t = 1; t <= seen; ++t) {
      if (tickets.count(t)) continue;
      auto v = el.check(r + "ticket/" + std::to_string(t));
      if (!v.isOk()) return v.status();
      if (!v.value()) continue;
      auto text = el.get(r + "ticket/" + std::to_string(t), milliseconds(1000));
      Ticket tk;
      if (!text.isOk() || !parseTicket(text.value(), &tk)) tk.workerId.clear();
      tickets[t] = tk;
    }
    std::vector<std::string> arrived;
    for (const auto& [t, tk] : tickets) {
      if (tk.workerId.empty()) continue;
      auto dead = isDead(el, tk.workerId);
      if (!dead.isOk()) return dead.status();
      if (!dead.value()) arrived.push_back(tk.workerId);
    }
    bool complete = false;
    if (!previous.empty()) {
      // Every member of the previous epoch is here or dead.
      complete = true;
      for (const auto& w : previous) {
        if (std::find(arrived.begin(), arrived.end(), w) != arrived.end()) continue;
        auto dead = isDead(el, w);
        if (!dead.isOk()) return dead.status();
        if (!dead.value()) {
          complete = false;
          break;
        }
      }
    } else {
      auto live = readInt(el, "live", -1);
      if (!live.isOk()) return live.status();
      complete = live.value() > 0 && seen >= live.value();
    }
    // Below min-np the survivors wait (to the deadline) for the launcher's
    // replacements, which arrive here as newcomers.
    const bool enough = static_cast<int64_t>(arrived.size()) >= std::max<int64_t>(1, minNp.value());
    const auto now = Clock::now();
    if (now >= deadline || (enough && (complete || now - lastChange >= req.settle))) break;
    std::this_thread::sleep_for(req.poll);
  }

  auto n = el.add(r + "arrivals", 0);  // arrivals after this read try the next epoch
  if (!n.isOk()) return n.status();
  std::vector<Ticket> survivors, newcomers;
  for (int64_t t = 1; t <= n.value(); ++t) {
    // An arrival that died between counting itself and writing its ticket
    // leaves a gap; the wait is short because the ticket follows the count.
    auto text = el.get(r + "ticket/" + std::to_string(t), req.settle);
    Ticket tk;
    if (!text.isOk() || !parseTicket(text.value(), &tk)) continue;
    auto dead = isDead(el, tk.workerId);
    if (dead.isOk() && dead.value()) continue;
    tk.number = t;
    if (tk.settings != (req.settings.empty() ? "-" : req.settings)) {
      // Admitting it would fail every member at the next set-up.
      HORA_RETURN_IF_ERROR(el.set(r + "rejected/" + tk.workerId,
                                  "worker " + tk.workerId + " on " + tk.host + " runs with " +
                                      tk.settings + " but the job's members run with " +
                                      req.settings +
                                      "; start it with the same hora version and settings"));
      continue;
    }
    (tk.survivor ? survivors : newcomers).push_back(tk);
  }
  std::sort(survivors.begin(), survivors.end(),
            [](const Ticket& a, const Ticket& b) { return a.lastRank < b.lastRank; });
  const int64_t count = static_cast<int64_t>(survivors.size() + newcomers.size());
  if (count < std::max<int64_t>(1, minNp.value())) {
    std::string why =
        "only " + std::to_string(count) + " worker(s) arrived to form epoch " +
        std::to_string(target) + " but the job needs at least " + std::to_string(minNp.value()) +
        " (--min-np) and no replacement came within HORA_ELASTIC_TIMEOUT_S; the others were "
        "lost. Restart the job from its last checkpoint, or lower --min-np";
    return el.set(r + "failed", why);
  }
  std::string members;
  for (const auto* group : {&survivors, &newcomers})
    for (const auto& tk : *group) members += tk.workerId + "\n";
  HORA_LOG(logger, kInfo) << "worker " << req.workerId << " formed epoch " << target << " with "
                          << count << " workers (" << survivors.size() << " from epoch "
                          << target - 1 << ", " << newcomers.size() << " new)";
  HORA_RETURN_IF_ERROR(el.set(r + "members", members));
  auto current = el.add("round", 0);
  if (!current.isOk()) return current.status();
  if (current.value() < target) return el.add("round", target - current.value()).status();
  return Status::ok();
}

}  // namespace

Status recordInitialMember(Store& el, const std::string& workerId, int rank, int size) {
  HORA_RETURN_IF_ERROR(el.set("worker/" + workerId + "/epoch", "0"));
  HORA_RETURN_IF_ERROR(el.set("r0/size", std::to_string(size)));
  return el.set("r0/rank/" + std::to_string(rank), workerId);
}

std::vector<std::string> membersOf(Store& el, int64_t epoch) {
  if (epoch < 0) return {};
  if (epoch > 0) {
    auto present = el.check(round(epoch) + "members");
    if (!present.isOk() || !present.value()) return {};
    auto text = el.get(round(epoch) + "members", milliseconds(1000));
    return text.isOk() ? splitLines(text.value()) : std::vector<std::string>{};
  }
  auto size = readInt(el, "r0/size", -1);
  if (!size.isOk() || size.value() <= 0) return {};
  std::vector<std::string> out;
  for (int64_t r = 0; r < size.value(); ++r) {
    auto present = el.check("r0/rank/" + std::to_string(r));
    if (!present.isOk() || !present.value()) return {};  // one never arrived: unknown
    auto id = el.get("r0/rank/" + std::to_string(r), milliseconds(1000));
    if (!id.isOk()) return {};
    out.push_back(id.value());
  }
  return out;
}

Result<int64_t> lastEpochOf(Store& el, const std::string& workerId) {
  return readInt(el, "worker/" + workerId + "/epoch", -1);
}

Result<Membership> formEpoch(Store& el, const FormRequest& req, const Logger& logger) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(req.timeout);
  int64_t target = req.lastEpoch + 1;
  // Survivors lead and are listed first. A survivor stays one when an epoch
  // fails to form (its leader died), not when it arrived too late for one.
  bool survivor = req.lastEpoch >= 0;
  if (req.lastEpoch < 0) {
    auto newest = el.add("round", 0);
    if (!newest.isOk()) return newest.status();
    target = newest.value() + 1;
  }
  for (;;) {
    const std::string r = round(target);
    auto t = el.add(r + "arrivals", 1);
    if (!t.isOk()) return t.status();
    // Only a survivor leads: a newcomer arriving first must not close a
    // membership of one before the members come.
    HORA_RETURN_IF_ERROR(el.set(r + "ticket/" + std::to_string(t.value()),
                                req.workerId + " " + std::to_string(req.lastEpoch) + " " +
                                    std::to_string(req.lastRank) + " " + req.host + " " +
                                    (survivor ? "S" : "N") + " " +
                                    (req.settings.empty() ? "-" : req.settings)));
    if (survivor) {
      auto s = el.add(r + "survivors", 1);
      if (!s.isOk()) return s.status();
      if (s.value() == 1) {
        HORA_RETURN_IF_ERROR(el.set(r + "leader", req.workerId));
        // The leader gives up a little before the others, so that they
        // read its reason instead of timing out themselves.
        const auto margin = std::min<Clock::duration>(
            std::chrono::seconds(1), std::chrono::duration_cast<Clock::duration>(req.timeout) / 10);
        HORA_RETURN_IF_ERROR(lead(el, target, req, deadline - margin, logger));
      }
    }
    // Wait for the list, watching the leader: if it dies mid-formation the
    // epoch never forms and everyone moves on to the next one.
    bool moveOn = false;
    for (;;) {
      auto members = el.get(r + "members", req.poll * 10);
      if (members.isOk()) {
        auto workers = splitLines(members.value());
        auto it = std::find(workers.begin(), workers.end(), req.workerId);
        if (it == workers.end()) {
          auto rejected = el.check(r + "rejected/" + req.workerId);
          if (!rejected.isOk()) return rejected.status();
          if (rejected.value()) {
            auto why = el.get(r + "rejected/" + req.workerId, milliseconds(1000));
            return invalidArgument(why.isOk() ? why.value() : "the members refused this worker");
          }
          HORA_LOG(logger, kInfo) << "worker " << req.workerId << " arrived after epoch " << target
                                  << " was formed; waiting to join the next one";
          moveOn = true;
          survivor = false;
          break;
        }
        HORA_RETURN_IF_ERROR(el.set("worker/" + req.workerId + "/epoch", std::to_string(target)));
        Membership m;
        m.epoch = target;
        m.rank = static_cast<int>(it - workers.begin());
        m.workers = std::move(workers);
        return m;
      }
      if (members.status().code() != Code::kTimeout) return members.status();
      auto failed = el.check(r + "failed");
      if (!failed.isOk()) return failed.status();
      if (failed.value()) {
        auto why = el.get(r + "failed", milliseconds(1000));
        return membershipError(why.isOk() ? why.value() : "epoch formation failed");
      }
      auto hasLeader = el.check(r + "leader");
      if (!hasLeader.isOk()) return hasLeader.status();
      if (hasLeader.value()) {
        auto leader = el.get(r + "leader", milliseconds(1000));
        if (leader.isOk()) {
          auto dead = isDead(el, leader.value());
          if (dead.isOk() && dead.value()) {
            HORA_LOG(logger, kWarning)
                << "worker " << leader.value() << " died while forming epoch " << target
                << "; forming the next one";
            moveOn = true;
            break;
          }
        }
      }
      if (Clock::now() >= deadline)
        return timeoutError("worker " + req.workerId + " waited " +
                            std::to_string(static_cast<int64_t>(req.timeout.count())) +
                            " s (HORA_ELASTIC_TIMEOUT_S) to be admitted to epoch " +
                            std::to_string(target) +
                            " but no member of the running job came to form it (are the "
                            "members alive and committing? a newcomer joins at a commit)");
    }
    if (moveOn) ++target;
  }
}

Result<bool> membershipPending(Store& el, int64_t epoch) {
  return el.check(round(epoch + 1) + "arrivals");
}

}  // namespace hora
