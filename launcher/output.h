// Output forwarding: reads one worker stream (stdout or stderr) through Asio,
// cuts it into lines and writes each line, prefixed "[<rank>]<stdout>: " or
// "[<rank>]<stderr>: " like mpirun --tag-output, to horarun's own stdout or
// stderr with a single write() (horarun writes from one thread, so lines
// from different workers never mix mid-line). Optionally also appends the
// unprefixed line to a per-rank file (--output-filename DIR gives
// DIR/rank.<r>/stdout and .../stderr). Keeps the last lines in memory for the
// first-error report.
//
// Runs entirely on the Asio loop's thread (horarun's main thread). Nothing is
// dropped: the stream is read until EOF, a final unterminated line is flushed
// with a newline added, and a line longer than 64 KiB is emitted in pieces.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdio>
#include <deque>
#include <functional>
#include <string>

namespace horarun {

class OutputStream {
 public:
  // Takes ownership of fd (non-blocking read end). `label` goes between the brackets of the
  // prefix: the rank, or in elastic mode the worker id (ranks change at every epoch there).
  // `filePath` empty: no file copy. onEof runs once, on the loop thread.
  OutputStream(boost::asio::io_context& io, int fd, const std::string& label, bool isStderr,
               const std::string& filePath, std::function<void()> onEof);
  ~OutputStream();
  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;

  void start();
  // Gives up on the stream (a grandchild kept it open): flushes the partial line.
  void abandon();
  bool eof() const { return eof_; }
  // Up to the last `kTailLines` lines, oldest first.
  const std::deque<std::string>& tail() const { return tail_; }
  static constexpr size_t kTailLines = 10;

 private:
  void readMore();
  void emit(const char* data, size_t n, std::string* batch);
  void finish();

  boost::asio::posix::stream_descriptor sd_;
  std::string prefix_;
  int toFd_;
  FILE* file_ = nullptr;
  std::function<void()> onEof_;
  std::string partial_;
  std::deque<std::string> tail_;
  char buf_[65536];
  bool eof_ = false;
};

// Writes all of `data` to fd (retrying short writes and EINTR).
void writeAll(int fd, const std::string& data);

}  // namespace horarun
