// sockmesh-cni: the chained CNI plugin that tells the sockmesh node agent about pods. See
// plugin.h for what it answers and cni/event/pod_event.h for what it sends.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "base/version.h"
#include "cni/plugin/plugin.h"

namespace {

// stdin holds the network configuration (a few KiB); a runtime closes it after writing.
std::string read_stdin() {
  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  return text;
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // By hand, like the other sockmesh binaries; a runtime never passes arguments.
  if (sockmesh::print_version_if_asked(argc, argv, "sockmesh-cni")) return 0;
  auto env = sockmesh::cni::CniEnv::from_process();
  // VERSION may be run by hand from a terminal, with nothing on stdin.
  bool skip_stdin = env.command == "VERSION" && isatty(STDIN_FILENO);
  std::string input = skip_stdin ? std::string() : read_stdin();
  auto out = sockmesh::cni::run_plugin(env, input);
  write_all(STDOUT_FILENO, out.stdout_text);
  write_all(STDERR_FILENO, out.stderr_text);
  return out.exit_code;
}
