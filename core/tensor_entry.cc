#include "core/tensor_entry.h"

namespace hora {

Status entryFailure(const TensorEntry& entry, int globalRank, const Status& why) {
  return Status(why.code(), std::string(collectiveName(entry.request.kind)) + " \"" +
                                entry.request.name + "\" on rank " + std::to_string(globalRank) +
                                ": " + why.message());
}

}  // namespace hora
