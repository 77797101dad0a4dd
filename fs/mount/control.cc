// The control commands (control.h).
#include "mount/control.h"

#include "bg/engine.h"
#include "platform/platform.h"

namespace tfs::mount {
namespace {

constexpr const char* kEngineList = "reconcile, promote, copygc, all";

struct Token {
  const char* p;
  usize n;
};

// Splits `line` at spaces and tabs into at most `max` tokens; returns how many
// there were (more than `max`: max + 1).
u32 Split(const char* line, usize len, Token* out, u32 max) {
  u32 n = 0;
  usize i = 0;
  while (i < len) {
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    if (i == len) break;
    const usize start = i;
    while (i < len && line[i] != ' ' && line[i] != '\t') i++;
    if (n == max) return max + 1;
    out[n++] = Token{line + start, i - start};
  }
  return n;
}

bool Is(const Token& t, const char* word) {
  usize i = 0;
  for (; word[i] != '\0'; i++)
    if (i >= t.n || t.p[i] != word[i]) return false;
  return i == t.n;
}

Status Refuse(char* reply, usize cap, const char* what, const Token* t) {
  // (A token is quoted cut to 32 bytes: the reply stays one short line.)
  if (t != nullptr)
    platform::Format(reply, cap, "error: %s '%.*s' (%s)", what, int(t->n > 32 ? 32 : t->n), t->p,
                     kEngineList);
  else
    platform::Format(reply, cap, "error: %s", what);
  return Err::kInvalidArgument;
}

}  // namespace

Status RunControl(Instance& inst, const char* line, usize len, char* reply, usize cap) {
  if (cap == 0) return Err::kInvalidArgument;
  reply[0] = '\0';
  if (!inst.open()) return Refuse(reply, cap, "the filesystem is not mounted", nullptr);
  constexpr u32 kMaxTokens = 16;  // (a name twice is fine)
  Token tok[kMaxTokens];
  const u32 n = Split(line, len, tok, kMaxTokens);
  const bool pause = n > 0 && Is(tok[0], "pause");
  if (n == 0 || (!pause && !Is(tok[0], "resume"))) {
    if (n == 0) return Refuse(reply, cap, "usage: pause|resume ENGINE... (ENGINE: reconcile, promote, copygc, all)",
                              nullptr);
    platform::Format(reply, cap, "error: unknown command '%.*s' (pause, resume)",
                     int(tok[0].n > 32 ? 32 : tok[0].n), tok[0].p);
    return Err::kInvalidArgument;
  }
  if (n == 1 || n > kMaxTokens)
    return Refuse(reply, cap, pause ? "usage: pause ENGINE... (ENGINE: reconcile, promote, copygc, all)"
                                    : "usage: resume ENGINE... (ENGINE: reconcile, promote, copygc, all)",
                  nullptr);
  u32 mask = 0;
  for (u32 i = 1; i < n; i++) {
    const u32 m = bg::EngineMask(tok[i].p, tok[i].n);
    if (m == 0) return Refuse(reply, cap, "unknown engine", &tok[i]);
    mask |= m;
  }
  if (pause)
    inst.engines().Pause(mask);
  else
    inst.engines().Resume(mask);
  usize at = usize(platform::Format(reply, cap, "ok %s:", pause ? "paused" : "resumed"));
  for (u32 i = 0; i < bg::kEngineCount && at < cap; i++)
    if ((mask >> i) & 1) at += usize(platform::Format(reply + at, cap - at, " %s", bg::EngineName(bg::EngineId(i))));
  return Status::Ok();
}

}  // namespace tfs::mount
