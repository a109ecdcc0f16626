#pragma once
// Waiting for something to change in the directories the installer cares about (the CNI conf dir,
// where another CNI may rewrite its config; the service account dir, where the token rotates; the
// bin dir). inotify, with a poll interval as a backstop: a directory that does not exist yet is
// watched once it does, and an event lost to a full queue is caught on the next tick.
#include <chrono>
#include <string>
#include <vector>

namespace sockmesh::cni::install {

class DirectoryWatch {
 public:
  explicit DirectoryWatch(std::vector<std::string> dirs);
  ~DirectoryWatch();
  DirectoryWatch(const DirectoryWatch&) = delete;
  DirectoryWatch& operator=(const DirectoryWatch&) = delete;

  // Returns after a change (true, once further events have been quiet for `settle`), after
  // `timeout` (false), or when `stop_fd` (e.g. a signalfd) is readable (false; check it).
  bool wait(std::chrono::milliseconds timeout, std::chrono::milliseconds settle, int stop_fd);

 private:
  void add_missing_watches();
  void drain();

  std::vector<std::string> dirs_;
  std::vector<int> watches_;  // per dir, -1 while not watched
  int fd_ = -1;
};

}  // namespace sockmesh::cni::install
