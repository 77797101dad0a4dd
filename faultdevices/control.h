// Control commands for a running fault device, as one-line text: the same handler
// serves the nbdkit plugin's control socket and `faultdev ctl`.
//
//   stall DURATION     nothing completes for DURATION from now ("30s", "500ms";
//                      a bare number is seconds)
//   unstall            end every stall in effect now
//   error read|write|both START+LEN
//                      EIO on that byte range from now on (sizes as "16MiB")
//   clear              unstall and clear-errors
//   powercut [SEED]    power cut now (unflushed cached writes kept/dropped/torn)
//   poweron            accept I/O again after a power cut
//   clear-errors       disable every [[errors]] range (added ones too)
//   stats              the device's stats as one JSON object
//
// Replies are one line: "ok ..." / JSON for stats / "error: ...".
//
// ControlServer listens on a unix socket with one thread that serves one client
// line at a time (control traffic is rare and tiny); Stop() ends it. A client gets
// `read_timeout_ms` (default 5 s) to send its command line; one that stays silent
// is answered "error: ..." and dropped, so it delays others by at most that long.
#ifndef TFS_FAULTDEVICES_CONTROL_H_
#define TFS_FAULTDEVICES_CONTROL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "faultdevices/device.h"

namespace faultdev {

// Runs one command line against `dev`; returns the one-line reply (no newline).
std::string HandleControl(FaultDevice& dev, const std::string& line);
// "30", "30s", "1.5s", "500ms", "40us" -> ns; nullopt if malformed, negative or
// above 10^6 s.
std::optional<uint64_t> ParseSeconds(const std::string& text);

class ControlServer {
 public:
  explicit ControlServer(int read_timeout_ms = 5000) : read_timeout_ms_(read_timeout_ms) {}
  ~ControlServer() { Stop(); }
  // Binds `path` (replacing a stale socket) and starts serving. False + *error on failure.
  bool Start(FaultDevice* dev, const std::string& path, std::string* error);
  void Stop();

 private:
  void Loop();

  int read_timeout_ms_;
  FaultDevice* dev_ = nullptr;
  std::string path_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
};

// Client side: sends one command to a control socket and returns the reply line.
// False + *error when the socket cannot be reached.
bool SendControl(const std::string& path, const std::string& command, std::string* reply, std::string* error);

}  // namespace faultdev

#endif  // TFS_FAULTDEVICES_CONTROL_H_
