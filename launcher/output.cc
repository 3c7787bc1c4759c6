#include "output.h"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/read.hpp>
#include <cerrno>
#include <cstring>

namespace horarun {

namespace {
constexpr size_t kMaxLine = 65536;
}

void writeAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own stdout is gone: nothing sensible to do
    done += static_cast<size_t>(n);
  }
}

OutputStream::OutputStream(boost::asio::io_context& io, int fd, const std::string& label,
                           bool isStderr, const std::string& filePath, std::function<void()> onEof)
    : sd_(io, fd),
      prefix_("[" + label + "]<" + (isStderr ? "stderr" : "stdout") + ">: "),
      toFd_(isStderr ? 2 : 1),
      onEof_(std::move(onEof)) {
  if (!filePath.empty()) file_ = std::fopen(filePath.c_str(), "w");
}

OutputStream::~OutputStream() {
  if (file_) std::fclose(file_);
}

void OutputStream::start() { readMore(); }

void OutputStream::readMore() {
  sd_.async_read_some(boost::asio::buffer(buf_, sizeof(buf_)),
                      [this](const boost::system::error_code& ec, size_t n) {
                        if (eof_) return;
                        std::string batch;
                        if (n > 0) emit(buf_, n, &batch);
                        writeAll(toFd_, batch);
                        if (ec) {
                          finish();
                          return;
                        }
                        readMore();
                      });
}

// Appends complete lines of data (with the previous partial line) to batch.
void OutputStream::emit(const char* data, size_t n, std::string* batch) {
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != '\n') continue;
    partial_.append(data + start, i - start);
    start = i + 1;
    batch->append(prefix_).append(partial_).push_back('\n');
    if (file_) std::fprintf(file_, "%s\n", partial_.c_str());
    tail_.push_back(std::move(partial_));
    if (tail_.size() > kTailLines) tail_.pop_front();
    partial_.clear();
  }
  partial_.append(data + start, n - start);
  if (partial_.size() >= kMaxLine) {
    batch->append(prefix_).append(partial_).push_back('\n');
    if (file_) std::fprintf(file_, "%s\n", partial_.c_str());
    partial_.clear();
  }
}

void OutputStream::finish() {
  if (eof_) return;
  eof_ = true;
  if (!partial_.empty()) {
    std::string batch = prefix_ + partial_ + "\n";
    if (file_) std::fprintf(file_, "%s\n", partial_.c_str());
    tail_.push_back(partial_);
    if (tail_.size() > kTailLines) tail_.pop_front();
    partial_.clear();
    writeAll(toFd_, batch);
  }
  if (file_) std::fflush(file_);
  boost::system::error_code ignored;
  sd_.close(ignored);
  if (onEof_) onEof_();
}

void OutputStream::abandon() {
  if (eof_) return;
  // Drain what is already buffered in the pipe, then stop.
  for (;;) {
    ssize_t n = read(sd_.native_handle(), buf_, sizeof(buf_));
    if (n <= 0) break;
    std::string batch;
    emit(buf_, static_cast<size_t>(n), &batch);
    writeAll(toFd_, batch);
  }
  finish();
}

}  // namespace horarun
