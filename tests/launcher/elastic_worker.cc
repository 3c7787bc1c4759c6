// elastic_worker: the fake worker of the elastic launcher tests (tests/launcher/elastic_*_test.sh).
// It does no training: it shows what horarun gave it and what horarun publishes in the store.
//
//   elastic_worker DIR
//
// On start it writes DIR/<worker id>.env, one line:
//   id=w2 newcomer=1 elastic=1 external=1 rank=- size=- local_rank=- pid=1234
// ("-" = variable not set). Then, every 50 ms, it reads the hora/el/ keys from the store that
// horarun hosts (through hora_core's TcpStoreClient: the C ABI has no store client) and
// rewrites DIR/<id>.store, one line:
//   live=2 min_np=2 max_np=4 dead/w0=- dead/w1=signal_9 ...
// for dead/w0..dead/w15 ("-" = missing; spaces in values become '_'). It exits with the code in
// DIR/exit.<id> or DIR/exit.all when one of them appears, and with code 3 after 120 s so that a
// broken test never leaves it behind.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/tcp_store.h"

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "-";
}

// Written to a temporary name and renamed, so the test never reads half a line.
void writeFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

bool readCode(const std::string& path, int* code) {
  std::ifstream in(path);
  if (!in) return false;
  *code = 0;
  in >> *code;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: elastic_worker DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::string id = env("HORA_WORKER_ID");
  std::ostringstream e;
  e << "id=" << id << " newcomer=" << env("HORA_ELASTIC_NEWCOMER")
    << " elastic=" << env("HORA_ELASTIC") << " external=" << env("HORA_STORE_EXTERNAL")
    << " rank=" << env("HORA_RANK") << " size=" << env("HORA_SIZE")
    << " local_rank=" << env("HORA_LOCAL_RANK") << " pid=" << getpid();
  writeFile(dir + "/" + id + ".env", e.str());
  std::printf("elastic_worker %s started (%s)\n", id.c_str(), e.str().c_str());
  std::fflush(stdout);

  auto client = hora::TcpStoreClient::connect(
      env("HORA_STORE_ADDR"), std::atoi(env("HORA_STORE_PORT").c_str()), env("HORA_SECRET"),
      std::chrono::seconds(10), hora::Logger(hora::LogLevel::kWarning, "[worker] "));
  if (!client.isOk()) {
    std::fprintf(stderr, "elastic_worker %s: cannot reach the store: %s\n", id.c_str(),
                 client.status().toString().c_str());
    return 4;
  }
  auto store = client.take();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ostringstream s;
    auto read = [&](const std::string& key) -> std::string {
      auto has = store->check("hora/el/" + key);
      if (!has.isOk() || !has.value()) return "-";
      auto got = store->get("hora/el/" + key, std::chrono::milliseconds(1000));
      if (!got.isOk()) return "?";
      std::string v = got.value();
      for (char& c : v)
        if (c == ' ') c = '_';  // one word per field: "signal 9" -> "signal_9"
      return v;
    };
    for (const char* key : {"live", "min_np", "max_np"}) s << key << "=" << read(key) << " ";
    for (int w = 0; w < 16; ++w) {
      const std::string key = "dead/w" + std::to_string(w);
      s << key << "=" << read(key) << " ";
    }
    writeFile(dir + "/" + id + ".store", s.str());
    int code = 0;
    if (readCode(dir + "/exit." + id, &code) || readCode(dir + "/exit.all", &code)) {
      std::printf("elastic_worker %s exiting with code %d\n", id.c_str(), code);
      return code;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::fprintf(stderr, "elastic_worker %s: nobody stopped me in 120 s\n", id.c_str());
  return 3;
}
