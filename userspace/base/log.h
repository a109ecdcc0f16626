#pragma once
// Line-oriented logging for operators: one line per event, "time level scope message key=value".
// Levels are per scope and can be changed at run time (the admin /logging endpoint).
#include <atomic>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace sockmesh::log {

enum class Level { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4, kOff = 5 };

std::string_view level_name(Level level);
bool parse_level(std::string_view text, Level* out);

// The scopes the code logs under (sorted). Levels can be set for these only, so that the admin
// /logging endpoint stores nothing for a name it does not know.
const std::vector<std::string_view>& known_scopes();
bool is_known_scope(std::string_view scope);

// Sets the level for every scope, or for one known scope ("proxy", "tls", "config", ...); an
// unknown scope is refused (false) and nothing is stored.
void set_level(Level level);
bool set_level(std::string_view scope, Level level);
Level level_of(std::string_view scope);
// "scope=level" pairs currently set, the default first ("default=info,access=debug").
std::string describe_levels();

bool enabled(std::string_view scope, Level level);
void write(std::string_view scope, Level level, std::string_view message);

class Line {
 public:
  Line(std::string_view scope, Level level) : scope_(scope), level_(level) {}
  ~Line() { write(scope_, level_, out_.str()); }
  template <typename T>
  Line& operator<<(const T& v) {
    out_ << v;
    return *this;
  }

 private:
  std::string_view scope_;
  Level level_;
  std::ostringstream out_;
};

}  // namespace sockmesh::log

// A loop that runs at most once: a single statement, safe inside an unbraced if/else.
#define SM_LOG(scope, lvl)                                                                         \
  for (bool sm_log_on_ = ::sockmesh::log::enabled(scope, ::sockmesh::log::Level::lvl); sm_log_on_; \
       sm_log_on_ = false)                                                                         \
  ::sockmesh::log::Line(scope, ::sockmesh::log::Level::lvl)

#define SM_TRACE(scope) SM_LOG(scope, kTrace)
#define SM_DEBUG(scope) SM_LOG(scope, kDebug)
#define SM_INFO(scope) SM_LOG(scope, kInfo)
#define SM_WARN(scope) SM_LOG(scope, kWarn)
#define SM_ERROR(scope) SM_LOG(scope, kError)
