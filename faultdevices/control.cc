// Control channel (see control.h). The server thread polls the listening socket
// and a stop pipe, so Stop() never has to interrupt a blocking accept(). Each
// connection is read up to a newline (bounded to 4 KiB and to the read timeout,
// polling the stop pipe too), answered and closed: a client that connects and
// says nothing can neither block other clients for long nor keep Stop() (and so
// nbdkit) from returning.
#include "faultdevices/control.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>

#include "faultdevices/timer.h"  // NowNs

namespace faultdev {
namespace {

bool FillAddr(const std::string& path, sockaddr_un* addr, std::string* error) {
  memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr->sun_path)) {
    *error = path + ": socket path too long";
    return false;
  }
  memcpy(addr->sun_path, path.c_str(), path.size());
  return true;
}

std::string ReadLine(int fd, size_t max) {
  std::string line;
  char c;
  while (line.size() < max) {
    ssize_t n = read(fd, &c, 1);
    if (n <= 0 || c == '\n') break;
    line += c;
  }
  return line;
}

// Server side: reads one line from a client, giving up after `timeout_ms` in all
// or as soon as `stop_fd` becomes readable. nullopt when no full command arrived.
std::optional<std::string> ReadCommand(int fd, size_t max, int stop_fd, int timeout_ms) {
  std::string line;
  uint64_t deadline = NowNs() + uint64_t(timeout_ms) * 1'000'000;
  char buf[512];
  while (line.size() < max) {
    uint64_t now = NowNs();
    if (now >= deadline) return std::nullopt;
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    int n = poll(fds, 2, int((deadline - now + 999'999) / 1'000'000));
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::nullopt;
    }
    if (fds[1].revents != 0) return std::nullopt;
    if (n == 0) continue;  // the deadline check above ends it
    // Read only what is there, up to the newline's chunk; a command is one line and
    // the connection is closed after the reply, so bytes past it are ignored.
    ssize_t got = read(fd, buf, std::min(sizeof(buf), max - line.size()));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return line.empty() ? std::nullopt : std::optional<std::string>(line);  // EOF ends a line
    for (ssize_t i = 0; i < got; i++) {
      if (buf[i] == '\n') return line;
      line += buf[i];
    }
  }
  return line;
}

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    off += size_t(n);
  }
}

}  // namespace

// "30", "30s", "1.5s", "500ms" -> ns; nullopt if malformed or above 10^6 s.
std::optional<uint64_t> ParseSeconds(const std::string& text) {
  size_t used = 0;
  double v;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return std::nullopt;
  }
  const std::string unit = text.substr(used);
  double scale = unit.empty() || unit == "s" ? 1e9 : unit == "ms" ? 1e6 : unit == "us" ? 1e3 : -1;
  if (scale < 0 || !(v >= 0) || v * scale / 1e9 > 1e6) return std::nullopt;
  return uint64_t(v * scale);
}

std::string HandleControl(FaultDevice& dev, const std::string& line) {
  std::istringstream in(line);
  std::string cmd, arg, extra;
  in >> cmd;
  if (cmd == "stall") {
    std::optional<uint64_t> ns;
    if (in >> arg) ns = ParseSeconds(arg);
    if (!ns || (in >> extra)) return "error: usage: stall DURATION (e.g. 30s, 500ms; a bare number is seconds)";
    dev.StallFor(*ns);
    std::ostringstream os;
    os << "ok stalled for " << double(*ns) / 1e9 << " s";
    return os.str();
  }
  if (cmd == "unstall") {
    dev.Unstall();
    return "ok unstalled";
  }
  if (cmd == "error") {
    // error read|write|both START+LEN
    std::string ops, range;
    const char* usage = "error: usage: error read|write|both START+LEN (e.g. error read 16MiB+1MiB)";
    if (!(in >> ops >> range) || (in >> extra)) return usage;
    for (char& c : ops) c = char(tolower(static_cast<unsigned char>(c)));
    ErrorRange e;
    if (ops == "read") {
      e.reads = true, e.writes = false;
    } else if (ops == "write") {
      e.reads = false, e.writes = true;
    } else if (ops == "both") {
      e.reads = e.writes = true;
    } else {
      return usage;
    }
    const size_t plus = range.find('+');
    std::optional<uint64_t> off, len;
    if (plus != std::string::npos) {
      off = ParseSize(range.substr(0, plus));
      len = ParseSize(range.substr(plus + 1));
    }
    if (!off || !len || *len == 0) return usage;
    const uint64_t size = dev.Info().size;
    if (*off >= size || *len > size - *off) {
      return "error: range " + range + " is outside the device (" + std::to_string(size) + " bytes)";
    }
    e.offset = *off;
    e.length = *len;
    dev.AddErrors(e);
    return "ok " + ops + " errors on [" + std::to_string(*off) + ", " + std::to_string(*off + *len) + ")";
  }
  if (cmd == "clear") {
    dev.Unstall();
    dev.ClearErrors();
    return "ok stalls ended, errors cleared";
  }
  if (cmd == "powercut") {
    std::optional<uint64_t> seed;
    if (in >> arg) {
      char* end = nullptr;
      errno = 0;
      unsigned long long v = strtoull(arg.c_str(), &end, 10);
      if (arg[0] == '-' || *end != '\0' || errno != 0 || (in >> extra)) return "error: usage: powercut [SEED]";
      seed = v;
    }
    CutOutcome out = dev.PowerCut(seed);
    return "ok power cut: kept " + std::to_string(out.kept) + ", dropped " + std::to_string(out.dropped) +
           ", torn " + std::to_string(out.torn);
  }
  if (cmd == "poweron") {
    dev.PowerOn();
    return "ok powered on";
  }
  if (cmd == "clear-errors") {
    dev.ClearErrors();
    return "ok errors cleared";
  }
  if (cmd == "stats") {
    return dev.Stats().ToJson();  // compact: one line
  }
  return "error: unknown command '" + cmd +
         "' (stall, unstall, error, clear, powercut, poweron, clear-errors, stats)";
}

bool ControlServer::Start(FaultDevice* dev, const std::string& path, std::string* error) {
  dev_ = dev;
  path_ = path;
  sockaddr_un addr;
  if (!FillAddr(path, &addr, error)) return false;
  unlink(path.c_str());
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 8) != 0 || pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    *error = path + ": cannot listen: " + strerror(errno);
    Stop();
    return false;
  }
  thread_ = std::thread([this] { Loop(); });
  return true;
}

void ControlServer::Stop() {
  if (thread_.joinable()) {
    char c = 0;
    if (write(stop_pipe_[1], &c, 1) < 0) {
      // The loop also ends when the pipe closes below; nothing else to do.
    }
    thread_.join();
  }
  for (int* fd : {&listen_fd_, &stop_pipe_[0], &stop_pipe_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  if (!path_.empty()) {
    unlink(path_.c_str());
    path_.clear();
  }
}

void ControlServer::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    int n = poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::optional<std::string> line = ReadCommand(c, 4096, stop_pipe_[0], read_timeout_ms_);
      if (line) {
        WriteAll(c, HandleControl(*dev_, *line) + "\n");
      } else {
        WriteAll(c, "error: no command received within " + std::to_string(read_timeout_ms_) + " ms\n");
      }
      close(c);
    }
  }
}

bool SendControl(const std::string& path, const std::string& command, std::string* reply, std::string* error) {
  sockaddr_un addr;
  if (!FillAddr(path, &addr, error)) return false;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    *error = path + ": cannot connect: " + strerror(errno);
    if (fd >= 0) close(fd);
    return false;
  }
  WriteAll(fd, command + "\n");
  *reply = ReadLine(fd, 16 << 20);
  close(fd);
  return true;
}

}  // namespace faultdev
