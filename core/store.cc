// The store's collective helper (core/store.h).
#include "core/store.h"

namespace hora {

Result<std::vector<std::string>> exchangeValues(Store& store, const std::string& key, int rank,
                                                const std::vector<int>& ranks,
                                                const std::string& mine,
                                                std::chrono::milliseconds timeout,
                                                const std::string& who) {
  HORA_RETURN_IF_ERROR(store.set(key + "/" + std::to_string(rank), mine));
  std::vector<std::string> all;
  all.reserve(ranks.size());
  for (int r : ranks) {
    if (r == rank) {
      all.push_back(mine);
      continue;
    }
    auto v = store.get(key + "/" + std::to_string(r), timeout);
    if (!v.isOk()) return v.status().withContext(who + ": waiting for rank " + std::to_string(r));
    all.push_back(v.take());
  }
  return all;
}

std::vector<int> allRanks(int size) {
  std::vector<int> v(static_cast<size_t>(std::max(size, 0)));
  for (int i = 0; i < size; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

}  // namespace hora
