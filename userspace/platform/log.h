// Where the platform's log lines go besides stderr (userspace only).
//
// The mount command's daemon gets its log=FILE only as stderr once it is
// serving; what the store logs while it opens (journal damage, replay,
// stale tables) would otherwise reach the terminal alone. SetLogCopy(fd)
// makes every line also go to `fd` until SetLogCopy(-1); the tools' own
// error lines (PrintError) follow it too, through LogCopy().
#ifndef TFS_USERSPACE_PLATFORM_LOG_H_
#define TFS_USERSPACE_PLATFORM_LOG_H_

namespace tfs::userspace {

void SetLogCopy(int fd);
int LogCopy();  // the fd set, or -1

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_LOG_H_
