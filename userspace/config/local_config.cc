#include "config/local_config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <initializer_list>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/log.h"
#include "config/read_file.h"

namespace sockmesh::config {
namespace {

// Unwinds the recursive descent on the first error; never leaves this file.
struct Failure {
  ConfigError error;
};

// A node together with the path and position to blame when it is wrong. YAML::Node's assignment
// operator rewrites the referenced document node, so a Val is only ever constructed, never
// assigned.
struct Val {
  YAML::Node node;
  std::string path;
  YAML::Mark mark;
};

std::string field_path(const std::string& parent, std::string_view name) {
  if (parent.empty()) return std::string(name);
  return parent + "." + std::string(name);
}

std::string index_path(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

std::string key_path(const std::string& parent, const std::string& key) {
  bool numeric = !key.empty() &&
                 std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
  return parent + (numeric ? "[" + key + "]" : "[\"" + key + "\"]");
}

// An empty value (`key:`) carries the position of whatever token follows it, often on the next
// line; the key's position is the one a reader looks for.
YAML::Mark mark_of(const YAML::Node& node, const YAML::Mark& fallback) {
  if (node.IsNull() || node.Mark().is_null()) return fallback;
  return node.Mark();
}

bool is_core_tag(const std::string& tag, std::string_view type) {
  constexpr std::string_view kCore = "tag:yaml.org,2002:";
  return tag.size() == kCore.size() + type.size() && tag.compare(0, kCore.size(), kCore) == 0 &&
         tag.compare(kCore.size(), std::string::npos, type) == 0;
}

// "?" is yaml-cpp's tag for plain (unquoted, untagged) nodes, "!" for quoted scalars.
bool is_untagged(const std::string& tag) { return tag.empty() || tag == "?" || tag == "!"; }

bool is_plain(const YAML::Node& node) { return node.Tag() == "?"; }

bool split_once(std::string_view text, char sep, std::string_view* head, std::string_view* tail) {
  auto pos = text.find(sep);
  if (pos == std::string_view::npos) return false;
  *head = text.substr(0, pos);
  *tail = text.substr(pos + 1);
  return true;
}

// "a/b" with both parts non-empty and no further slash.
bool is_namespaced_name(std::string_view text) {
  std::string_view head, tail;
  return split_once(text, '/', &head, &tail) && !head.empty() && !tail.empty() &&
         tail.find('/') == std::string_view::npos;
}

std::string line_of(const YAML::Mark& mark) {
  return mark.is_null() ? std::string("?") : std::to_string(mark.line + 1);
}

constexpr std::string_view kUnsupported = "is not supported by sockmesh";

// Where each of the text's first `limit` YAML documents starts: the position of its top node.
// yaml-cpp 0.7's LoadAll never returns on some malformed text (a stray ',' at the top, as in
// "!tag ," or "&anchor ,"): the parser then reports an empty document at the same place again and
// again, and LoadAll collects them until memory runs out (jbeder/yaml-cpp#1040). Counting at most
// `limit` documents with the parser's events ends either way.
std::vector<YAML::Mark> document_starts(const std::string& text, size_t limit) {
  struct Starts : YAML::EventHandler {
    std::vector<YAML::Mark> marks;
    bool top = false;  // the next node event is a document's top node
    void node(const YAML::Mark& mark) {
      if (top) marks.back() = mark;
      top = false;
    }
    void OnDocumentStart(const YAML::Mark& mark) override {
      marks.push_back(mark);
      top = true;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
    void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
    void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  const std::string&) override {
      node(mark);
    }
    void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {
      node(mark);
    }
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {
      node(mark);
    }
    void OnMapEnd() override {}
  } starts;
  std::istringstream in(text);
  YAML::Parser parser(in);
  while (starts.marks.size() < limit && parser.HandleNextDocument(starts)) {
  }
  return starts.marks;
}

class Parser {
 public:
  explicit Parser(std::string_view file) : file_(file) {}

  state::SnapshotPtr run(std::string_view text);

  [[noreturn]] void fail(const YAML::Mark& mark, std::string field, std::string message) const {
    ConfigError e;
    e.file = file_;
    if (!mark.is_null()) {
      e.line = mark.line + 1;
      e.column = mark.column + 1;
    }
    e.field = std::move(field);
    e.message = std::move(message);
    throw Failure{std::move(e)};
  }
  [[noreturn]] void fail(const Val& v, std::string message) const {
    fail(v.mark, v.path, std::move(message));
  }

 private:
  // A mapping read as a record: every key must be one the caller lists, at most once.
  class Record {
   public:
    Record(const Parser& p, const Val& v, std::initializer_list<std::string_view> known);
    std::optional<Val> get(std::string_view key) const;
    Val require(std::string_view key) const;
    const Val& self() const { return self_; }

   private:
    const Parser& p_;
    Val self_;
    std::map<std::string, Val, std::less<>> fields_;
  };

  // Scalars.
  std::string str(const Val& v) const;
  std::string nonempty_str(const Val& v) const;
  bool boolean(const Val& v) const;
  uint64_t uint(const Val& v, uint64_t max) const;
  uint16_t port(const Val& v, bool allow_zero) const;
  IpAddress ip(const Val& v) const;
  IpNetwork network(const Val& v) const;
  template <typename E>
  E choice(const Val& v, std::initializer_list<std::pair<std::string_view, E>> options) const;

  // Collections; an empty value (`key:`) counts as empty, as an editor leaves it after deleting
  // the last entry.
  template <typename F>
  void each_item(const Val& v, F&& f) const;
  template <typename F>
  void each_entry(const Val& v, F&& f) const;
  void check_collection_tag(const Val& v) const;
  void count_visit(const Val& v) const;
  std::vector<std::string> strings(const Val& v) const;
  std::map<std::string, std::string> labels(const Val& v) const;
  std::map<uint16_t, uint16_t> port_map(const Val& v, bool allow_zero_target) const;
  // Fields that ztunnel knows and sockmesh does not implement: accepted only when they ask for
  // nothing, since ignoring them would change what traffic is allowed or where it goes.
  void require_absent(const Record& r, std::string_view key) const;

  state::Workload workload(const Val& v);
  state::Service service(const Val& v);
  state::Policy policy(const Val& v);
  state::PolicyMatch match(const Val& v) const;
  std::string string_match(const Val& v, bool principal) const;
  std::string service_account_match(const Val& v) const;
  state::Namespace namespace_entry(const Val& v);

  std::string file_;
  // Aliases share nodes, so a small document can name the same list exponentially many times;
  // legitimate reuse stays far below a few visits per byte of input.
  mutable size_t visits_left_ = 0;
  std::unordered_map<std::string, YAML::Mark> workload_uids_;
  std::unordered_map<IpAddress, std::pair<std::string, YAML::Mark>> workload_ips_;
  std::unordered_map<std::string, YAML::Mark> service_keys_;
  std::unordered_map<IpAddress, std::pair<std::string, YAML::Mark>> service_vips_;
  std::unordered_map<std::string, YAML::Mark> policy_keys_;
  std::unordered_map<std::string, YAML::Mark> namespace_names_;
};

Parser::Record::Record(const Parser& p, const Val& v, std::initializer_list<std::string_view> known)
    : p_(p), self_(v) {
  if (v.node.IsNull()) return;
  if (!v.node.IsMap()) p.fail(v, "expected a mapping");
  p.check_collection_tag(v);
  for (auto it = v.node.begin(); it != v.node.end(); ++it) {
    YAML::Node key = it->first;
    YAML::Node value = it->second;
    if (!key.IsScalar()) p.fail(key.Mark(), v.path, "field names must be strings");
    const std::string& name = key.Scalar();
    std::string path = field_path(v.path, name);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      p.fail(key.Mark(), path, "unknown field");
    }
    if (auto prev = fields_.find(name); prev != fields_.end()) {
      p.fail(key.Mark(), path,
             "duplicate field (first at line " + line_of(prev->second.mark) + ")");
    }
    fields_.emplace(name, Val{value, path, mark_of(value, key.Mark())});
  }
}

std::optional<Val> Parser::Record::get(std::string_view key) const {
  auto it = fields_.find(key);
  if (it == fields_.end()) return std::nullopt;
  return it->second;
}

Val Parser::Record::require(std::string_view key) const {
  auto it = fields_.find(key);
  if (it == fields_.end()) {
    p_.fail(self_.mark, field_path(self_.path, key), "missing required field");
  }
  return it->second;
}

std::string Parser::str(const Val& v) const {
  if (v.node.IsNull()) return "";
  if (!v.node.IsScalar()) fail(v, "expected a string");
  const std::string& tag = v.node.Tag();
  if (!is_untagged(tag) && !is_core_tag(tag, "str")) fail(v, "unexpected YAML tag '" + tag + "'");
  return v.node.Scalar();
}

std::string Parser::nonempty_str(const Val& v) const {
  std::string s = str(v);
  if (s.empty()) fail(v, "must not be empty");
  return s;
}

bool Parser::boolean(const Val& v) const {
  // The spellings serde_yaml (ztunnel's parser) accepts; YAML 1.1's yes/no/on/off are not booleans.
  if (v.node.IsScalar() && (is_plain(v.node) || is_core_tag(v.node.Tag(), "bool"))) {
    const std::string& s = v.node.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
  }
  fail(v, "expected true or false");
}

uint64_t Parser::uint(const Val& v, uint64_t max) const {
  // A quoted number is a string to serde_yaml, so ztunnel rejects it; so do we.
  if (!v.node.IsScalar() || !(is_plain(v.node) || is_core_tag(v.node.Tag(), "int"))) {
    fail(v, "expected an integer");
  }
  const std::string& s = v.node.Scalar();
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (s.empty() || ptr != s.data() + s.size() || !(s[0] >= '0' && s[0] <= '9')) {
    fail(v, "expected an integer, got '" + s + "'");
  }
  if (ec == std::errc::result_out_of_range || n > max) {
    fail(v, s + " is out of range (at most " + std::to_string(max) + ")");
  }
  return n;
}

uint16_t Parser::port(const Val& v, bool allow_zero) const {
  uint64_t n = uint(v, 65535);
  if (n == 0 && !allow_zero) fail(v, "port 0 is out of range (1-65535)");
  return static_cast<uint16_t>(n);
}

IpAddress Parser::ip(const Val& v) const {
  std::string s = str(v);
  auto a = IpAddress::parse(s);
  if (!a) fail(v, "'" + s + "' is not an IP address");
  return *a;
}

IpNetwork Parser::network(const Val& v) const {
  std::string s = str(v);
  auto n = IpNetwork::parse(s);
  if (!n) fail(v, "'" + s + "' is not an IP address or CIDR range");
  return *n;
}

template <typename E>
E Parser::choice(const Val& v,
                 std::initializer_list<std::pair<std::string_view, E>> options) const {
  std::string s = str(v);
  std::string expected;
  for (const auto& [name, value] : options) {
    if (s == name) return value;
    expected += expected.empty() ? "" : ", ";
    expected += name;
  }
  fail(v, "unknown value '" + s + "'; expected one of " + expected);
}

void Parser::check_collection_tag(const Val& v) const {
  const std::string& tag = v.node.Tag();
  if (!is_untagged(tag) && !is_core_tag(tag, "seq") && !is_core_tag(tag, "map")) {
    fail(v, "unexpected YAML tag '" + tag + "'");
  }
}

void Parser::count_visit(const Val& v) const {
  if (visits_left_ == 0) fail(v, "the document expands too much through aliases");
  --visits_left_;
}

template <typename F>
void Parser::each_item(const Val& v, F&& f) const {
  if (v.node.IsNull()) return;
  if (!v.node.IsSequence()) fail(v, "expected a list");
  check_collection_tag(v);
  size_t i = 0;
  for (auto it = v.node.begin(); it != v.node.end(); ++it, ++i) {
    count_visit(v);
    YAML::Node item = *it;
    f(Val{item, index_path(v.path, i), mark_of(item, v.mark)});
  }
}

template <typename F>
void Parser::each_entry(const Val& v, F&& f) const {
  if (v.node.IsNull()) return;
  if (!v.node.IsMap()) fail(v, "expected a mapping");
  check_collection_tag(v);
  std::map<std::string, YAML::Mark> seen;
  for (auto it = v.node.begin(); it != v.node.end(); ++it) {
    YAML::Node key = it->first;
    YAML::Node value = it->second;
    if (!key.IsScalar()) fail(key.Mark(), v.path, "keys must be scalars");
    count_visit(v);
    std::string path = key_path(v.path, key.Scalar());
    auto [prev, inserted] = seen.emplace(key.Scalar(), key.Mark());
    if (!inserted) {
      fail(key.Mark(), path, "duplicate key (first at line " + line_of(prev->second) + ")");
    }
    f(Val{key, path, key.Mark()}, Val{value, path, mark_of(value, key.Mark())});
  }
}

std::vector<std::string> Parser::strings(const Val& v) const {
  std::vector<std::string> out;
  each_item(v, [&](const Val& item) { out.push_back(nonempty_str(item)); });
  return out;
}

std::map<std::string, std::string> Parser::labels(const Val& v) const {
  std::map<std::string, std::string> out;
  each_entry(v,
             [&](const Val& key, const Val& value) { out.emplace(nonempty_str(key), str(value)); });
  return out;
}

std::map<uint16_t, uint16_t> Parser::port_map(const Val& v, bool allow_zero_target) const {
  std::map<uint16_t, uint16_t> out;
  each_entry(v, [&](const Val& key, const Val& value) {
    uint16_t from = port(key, false);
    uint16_t to = port(value, allow_zero_target);
    // "80" and "080" are different keys to YAML but the same port.
    if (!out.emplace(from, to).second) fail(key, "duplicate port " + std::to_string(from));
  });
  return out;
}

void Parser::require_absent(const Record& r, std::string_view key) const {
  auto v = r.get(key);
  if (!v) return;
  bool empty =
      v->node.IsNull() || ((v->node.IsSequence() || v->node.IsMap()) && v->node.size() == 0);
  if (!empty) fail(*v, std::string(kUnsupported));
}

state::Workload Parser::workload(const Val& v) {
  Record r(
      *this, v,
      {// ztunnel's Workload plus LocalWorkload's `services`.
       "uid", "name", "namespace", "serviceAccount", "trustDomain", "workloadIps", "protocol",
       "node", "network", "workloadName", "workloadType", "canonicalName", "canonicalRevision",
       "clusterId", "hostname", "services", "authorizationPolicies", "status", "networkMode",
       "nativeTunnel", "locality", "capacity", "waypoint", "networkGateway", "applicationTunnel",
       // sockmesh extension.
       "labels"});
  if (v.node.IsNull()) fail(v, "expected a mapping");
  state::Workload w;
  Val uid = r.require("uid");
  w.uid = nonempty_str(uid);
  if (auto [it, inserted] = workload_uids_.emplace(w.uid, uid.mark); !inserted) {
    fail(uid, "duplicate workload uid '" + w.uid + "' (first at line " + line_of(it->second) + ")");
  }
  if (auto f = r.get("name")) w.name = str(*f);
  w.namespace_name = nonempty_str(r.require("namespace"));
  // Empty means "the default", as ztunnel does for xDS workloads; identity() needs a value.
  if (auto f = r.get("serviceAccount"); f && !str(*f).empty()) w.service_account = str(*f);
  if (auto f = r.get("trustDomain"); f && !str(*f).empty()) w.trust_domain = str(*f);
  if (auto f = r.get("clusterId"); f && !str(*f).empty()) w.cluster_id = str(*f);
  if (auto f = r.get("node")) w.node = str(*f);
  if (auto f = r.get("network")) w.network = str(*f);
  w.workload_name = w.name;
  if (auto f = r.get("workloadName"); f && !str(*f).empty()) w.workload_name = str(*f);
  if (auto f = r.get("canonicalName")) w.canonical_name = str(*f);
  if (auto f = r.get("canonicalRevision")) w.canonical_revision = str(*f);
  if (auto f = r.get("hostname")) w.hostname = str(*f);
  if (auto f = r.get("protocol")) {
    w.protocol = choice<state::Protocol>(
        *f, {{"HBONE", state::Protocol::kHbone}, {"TCP", state::Protocol::kTcp}});
  }

  each_item(r.require("workloadIps"), [&](const Val& item) {
    IpAddress a = ip(item);
    auto [it, inserted] = workload_ips_.emplace(a, std::make_pair(w.uid, item.mark));
    if (!inserted) {
      fail(item, a.to_string() + " is already used by workload '" + it->second.first + "' (line " +
                     line_of(it->second.second) + ")");
    }
    w.ips.push_back(a);
  });

  if (auto f = r.get("services")) {
    each_entry(*f, [&](const Val& key, const Val& value) {
      std::string name = str(key);
      if (!is_namespaced_name(name)) {
        fail(key, "expected \"namespace/hostname\", got '" + name + "'");
      }
      w.services[name] = port_map(value, false);
    });
  }
  if (auto f = r.get("authorizationPolicies")) {
    each_item(*f, [&](const Val& item) {
      std::string name = str(item);
      if (!is_namespaced_name(name)) fail(item, "expected \"namespace/name\", got '" + name + "'");
      w.authorization_policies.push_back(name);
    });
  }
  if (auto f = r.get("labels")) w.labels = labels(*f);

  // Known to ztunnel, informational only (metrics, DNS, load-balancing weight); checked, unused.
  if (auto f = r.get("workloadType")) str(*f);
  if (auto f = r.get("hostname")) str(*f);
  if (auto f = r.get("capacity")) uint(*f, UINT32_MAX);
  if (auto f = r.get("locality")) {
    Record loc(*this, *f, {"region", "zone", "subzone"});
    for (auto k : {"region", "zone", "subzone"}) {
      if (auto g = loc.get(k)) str(*g);
    }
  }
  // Known to ztunnel, accepted only at the value that means "as sockmesh always behaves".
  if (auto f = r.get("status")) {
    if (choice<bool>(*f, {{"Healthy", true}, {"Unhealthy", false}}) == false) {
      fail(*f, "Unhealthy " + std::string(kUnsupported) + "; leave the workload out instead");
    }
  }
  if (auto f = r.get("networkMode")) {
    if (choice<bool>(*f, {{"Standard", true}, {"HostNetwork", false}}) == false) {
      fail(*f, "HostNetwork " + std::string(kUnsupported));
    }
  }
  if (auto f = r.get("nativeTunnel"); f && boolean(*f)) fail(*f, std::string(kUnsupported));
  require_absent(r, "waypoint");
  require_absent(r, "networkGateway");
  require_absent(r, "applicationTunnel");
  return w;
}

state::Service Parser::service(const Val& v) {
  Record r(*this, v,
           {"name", "namespace", "hostname", "vips", "ports", "subjectAltNames", "canonical",
            "ipFamilies", "visibility", "cidrVips", "endpoints", "waypoint", "weightedWaypoints",
            "loadBalancer"});
  if (v.node.IsNull()) fail(v, "expected a mapping");
  state::Service s;
  s.name = nonempty_str(r.require("name"));
  s.namespace_name = nonempty_str(r.require("namespace"));
  Val hostname = r.require("hostname");
  s.hostname = nonempty_str(hostname);
  if (auto [it, inserted] = service_keys_.emplace(s.key(), hostname.mark); !inserted) {
    fail(hostname,
         "duplicate service '" + s.key() + "' (first at line " + line_of(it->second) + ")");
  }
  each_item(r.require("vips"), [&](const Val& item) {
    // ztunnel's NetworkAddress: split at the first '/', network part may be empty.
    std::string text = str(item);
    std::string_view network, address;
    if (!split_once(text, '/', &network, &address)) {
      fail(item, "expected \"network/IP\" (the network may be empty, as in \"/10.0.0.1\"), got '" +
                     text + "'");
    }
    auto a = IpAddress::parse(address);
    if (!a) fail(item, "'" + std::string(address) + "' is not an IP address");
    // The snapshot looks services up by address alone, so a VIP must be unique across networks.
    auto [it, inserted] = service_vips_.emplace(*a, std::make_pair(s.key(), item.mark));
    if (!inserted) {
      fail(item, a->to_string() + " is already a VIP of service '" + it->second.first + "' (line " +
                     line_of(it->second.second) + ")");
    }
    s.vips.push_back(state::ServiceVip{std::string(network), *a});
  });
  // Target port 0 means "named port": the workload's own port map supplies the number.
  s.ports = port_map(r.require("ports"), true);
  if (auto f = r.get("subjectAltNames")) s.subject_alt_names = strings(*f);

  if (auto f = r.get("canonical")) boolean(*f);
  if (auto f = r.get("ipFamilies")) {
    choice<int>(*f, {{"Dual", 0}, {"IPv4", 1}, {"IPv6", 2}});
  }
  if (auto f = r.get("visibility")) {
    if (choice<bool>(*f, {{"Public", true}, {"Namespace", false}}) == false) {
      fail(*f, "Namespace " + std::string(kUnsupported));
    }
  }
  require_absent(r, "cidrVips");
  // Endpoints come from the workloads' `services` maps, as in ztunnel's local config.
  require_absent(r, "endpoints");
  require_absent(r, "waypoint");
  require_absent(r, "weightedWaypoints");
  require_absent(r, "loadBalancer");
  return s;
}

std::string Parser::string_match(const Val& v, bool principal) const {
  const std::string& tag = v.node.Tag();
  std::string out;
  if (v.node.IsMap()) {
    fail(v,
         "write a string match as a tagged value (!Exact x, !Prefix x, !Suffix x, "
         "!Presence []) or as a plain string");
  } else if (tag == "!Presence") {
    if (!v.node.IsNull() && !(v.node.IsSequence() && v.node.size() == 0)) {
      fail(v, "!Presence takes no value; write !Presence []");
    }
    out = "*";
  } else if (tag == "!Exact" || tag == "!Prefix" || tag == "!Suffix") {
    if (!v.node.IsScalar()) fail(v, "expected a string after " + tag);
    std::string s = v.node.Scalar();
    // The model spells wildcards with '*', so a literal '*' could not be told apart.
    if (s.find('*') != std::string::npos) fail(v, "'*' cannot appear in a " + tag + " value");
    if (tag == "!Exact") {
      if (s.empty()) fail(v, "must not be empty");
      out = s;
    } else if (tag == "!Prefix") {
      out = s + "*";
    } else {
      out = "*" + s;
    }
  } else if (!is_untagged(tag) && !is_core_tag(tag, "str")) {
    fail(v, "unknown tag '" + tag + "'; expected !Exact, !Prefix, !Suffix or !Presence");
  } else {
    // Istio's own spelling: "exact", "prefix*", "*suffix" or "*".
    out = nonempty_str(v);
    auto stars = std::count(out.begin(), out.end(), '*');
    bool ok = stars == 0 || (stars == 1 && (out.front() == '*' || out.back() == '*'));
    if (!ok) fail(v, "'*' is only allowed as the whole value, a prefix or a suffix");
  }
  // ztunnel compares principals with the identity's "spiffe://" stripped, so a value written with
  // it would silently never match.
  if (principal && out.rfind("spiffe://", 0) == 0) {
    fail(v, "write principals without \"spiffe://\" (e.g. cluster.local/ns/default/sa/client)");
  }
  return out;
}

std::string Parser::service_account_match(const Val& v) const {
  if (v.node.IsMap()) {
    // ztunnel's ServiceAccountMatch.
    Record r(*this, v, {"namespace", "serviceAccount"});
    return nonempty_str(r.require("namespace")) + "/" + nonempty_str(r.require("serviceAccount"));
  }
  // sockmesh extension: "namespace/serviceAccount", or "serviceAccount" for any namespace.
  std::string s = nonempty_str(v);
  if (s.find('/') != std::string::npos && !is_namespaced_name(s)) {
    fail(v, "expected \"namespace/serviceAccount\" or \"serviceAccount\", got '" + s + "'");
  }
  return s;
}

state::PolicyMatch Parser::match(const Val& v) const {
  Record r(*this, v,
           {"namespaces", "notNamespaces", "principals", "notPrincipals", "serviceAccounts",
            "notServiceAccounts", "sourceIps", "notSourceIps", "destinationIps",
            "notDestinationIps", "destinationPorts", "notDestinationPorts"});
  state::PolicyMatch m;
  auto string_matches = [&](std::string_view key, bool principal, std::vector<std::string>* out) {
    if (auto f = r.get(key)) {
      each_item(*f, [&](const Val& item) { out->push_back(string_match(item, principal)); });
    }
  };
  auto accounts = [&](std::string_view key, std::vector<std::string>* out) {
    if (auto f = r.get(key)) {
      each_item(*f, [&](const Val& item) { out->push_back(service_account_match(item)); });
    }
  };
  auto networks = [&](std::string_view key, std::vector<IpNetwork>* out) {
    if (auto f = r.get(key)) each_item(*f, [&](const Val& item) { out->push_back(network(item)); });
  };
  auto ports = [&](std::string_view key, std::vector<uint16_t>* out) {
    if (auto f = r.get(key)) {
      each_item(*f, [&](const Val& item) { out->push_back(port(item, false)); });
    }
  };
  string_matches("namespaces", false, &m.namespaces);
  string_matches("notNamespaces", false, &m.not_namespaces);
  string_matches("principals", true, &m.principals);
  string_matches("notPrincipals", true, &m.not_principals);
  accounts("serviceAccounts", &m.service_accounts);
  accounts("notServiceAccounts", &m.not_service_accounts);
  networks("sourceIps", &m.source_ips);
  networks("notSourceIps", &m.not_source_ips);
  networks("destinationIps", &m.destination_ips);
  networks("notDestinationIps", &m.not_destination_ips);
  ports("destinationPorts", &m.destination_ports);
  ports("notDestinationPorts", &m.not_destination_ports);
  return m;
}

state::Policy Parser::policy(const Val& v) {
  Record r(*this, v, {"name", "namespace", "scope", "action", "rules", "dryRun"});
  if (v.node.IsNull()) fail(v, "expected a mapping");
  state::Policy p;
  Val name = r.require("name");
  p.name = nonempty_str(name);
  p.namespace_name = nonempty_str(r.require("namespace"));
  if (auto [it, inserted] = policy_keys_.emplace(p.key(), name.mark); !inserted) {
    fail(name, "duplicate policy '" + p.key() + "' (first at line " + line_of(it->second) + ")");
  }
  p.scope = choice<state::PolicyScope>(
      r.require("scope"), {{"Global", state::PolicyScope::kGlobal},
                           {"Namespace", state::PolicyScope::kNamespace},
                           {"WorkloadSelector", state::PolicyScope::kWorkloadSelector}});
  p.action = choice<state::PolicyAction>(
      r.require("action"),
      {{"Allow", state::PolicyAction::kAllow}, {"Deny", state::PolicyAction::kDeny}});
  each_item(r.require("rules"), [&](const Val& rule_v) {
    state::PolicyRule rule;
    each_item(rule_v, [&](const Val& clause_v) {
      state::PolicyClause clause;
      each_item(clause_v, [&](const Val& match_v) { clause.push_back(match(match_v)); });
      rule.push_back(std::move(clause));
    });
    p.rules.push_back(std::move(rule));
  });
  if (auto f = r.get("dryRun")) p.dry_run = boolean(*f);
  return p;
}

state::Namespace Parser::namespace_entry(const Val& v) {
  Record r(*this, v, {"name", "labels"});
  if (v.node.IsNull()) fail(v, "expected a mapping");
  state::Namespace n;
  Val name = r.require("name");
  n.name = nonempty_str(name);
  if (auto [it, inserted] = namespace_names_.emplace(n.name, name.mark); !inserted) {
    fail(name, "duplicate namespace '" + n.name + "' (first at line " + line_of(it->second) + ")");
  }
  if (auto f = r.get("labels")) n.labels = labels(*f);
  return n;
}

state::SnapshotPtr Parser::run(std::string_view text) {
  visits_left_ = 4 * text.size() + 10000;
  std::string input(text);
  // Three, to tell a second document from the parser stuck on one spot (see document_starts).
  std::vector<YAML::Mark> starts = document_starts(input, 3);
  if (starts.size() > 2 && starts[2].pos == starts[1].pos) {
    fail(starts[1], "", "malformed YAML: no value can start here");
  }
  if (starts.size() > 1) fail(starts[1], "", "expected one YAML document, found more");
  std::vector<YAML::Node> docs;
  if (!starts.empty()) docs.push_back(YAML::Load(input));
  std::vector<state::Workload> workloads;
  std::vector<state::Service> services;
  std::vector<state::Policy> policies;
  std::vector<state::Namespace> namespaces;
  if (!docs.empty()) {
    Val root{docs[0], "", docs[0].Mark()};
    Record r(*this, root, {"workloads", "services", "policies", "namespaces"});
    if (auto f = r.get("workloads")) {
      each_item(*f, [&](const Val& item) { workloads.push_back(workload(item)); });
    }
    if (auto f = r.get("services")) {
      each_item(*f, [&](const Val& item) { services.push_back(service(item)); });
    }
    if (auto f = r.get("policies")) {
      each_item(*f, [&](const Val& item) { policies.push_back(policy(item)); });
    }
    if (auto f = r.get("namespaces")) {
      each_item(*f, [&](const Val& item) { namespaces.push_back(namespace_entry(item)); });
    }
  }
  return std::make_shared<const state::Snapshot>(std::move(workloads), std::move(services),
                                                 std::move(policies), std::move(namespaces));
}

}  // namespace

std::string ConfigError::to_string() const {
  std::string out = file;
  if (line > 0) {
    out += ":" + std::to_string(line);
    if (column > 0) out += ":" + std::to_string(column);
  }
  out += ": ";
  if (!field.empty()) out += field + ": ";
  out += message;
  return out;
}

ParseResult parse_local_config(std::string_view text, std::string_view file_name) {
  Parser parser(file_name);
  try {
    return parser.run(text);
  } catch (const Failure& f) {
    return f.error;
  } catch (const YAML::Exception& e) {
    ConfigError err;
    err.file = std::string(file_name);
    if (!e.mark.is_null()) {
      err.line = e.mark.line + 1;
      err.column = e.mark.column + 1;
    }
    err.message = "invalid YAML: " + e.msg;
    return err;
  } catch (const std::exception& e) {
    return ConfigError{std::string(file_name), 0, 0, "", e.what()};
  } catch (...) {
    return ConfigError{std::string(file_name), 0, 0, "", "unexpected error while parsing"};
  }
}

ParseResult load_local_config_file(const std::string& path) {
  std::string text;
  if (int err = read_config_file(path, &text); err != 0) {
    std::string why = read_config_error_text(err);
    return ConfigError{path, 0, 0, "", "cannot read: " + why};
  }
  return parse_local_config(text, path);
}

}  // namespace sockmesh::config
