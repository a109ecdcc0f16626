#include "identity/builtin_ca.h"

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/errno_text.h"
#include "base/log.h"
#include "identity/csr.h"
#include "identity/file_util.h"

namespace sockmesh::identity {
namespace {

constexpr std::string_view kScope = "identity";
// The root predates everything it signs by a comfortable margin: peers check the root's
// validity too, and a freshly created root must not look "not yet valid" to a lagging clock.
constexpr std::chrono::seconds kRootBackdate = std::chrono::hours(1);

time_t to_time_t(TimePoint t) { return std::chrono::system_clock::to_time_t(t); }

Result<EvpPkeyPtr> generate_p256() {
  ERR_clear_error();
  EvpPkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return Error{openssl_error("generating ECDSA P-256 key")};
  return key;
}

// 128 random bits with the top bit clear (DER integers are signed) and the next one set, so the
// serial is positive, never zero and always 16 bytes long.
bool set_random_serial(X509* cert) {
  unsigned char buf[16];
  if (RAND_bytes(buf, sizeof(buf)) != 1) return false;
  buf[0] = static_cast<unsigned char>((buf[0] & 0x7f) | 0x40);
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(BN_bin2bn(buf, sizeof(buf), nullptr), BN_free);
  return bn && BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert)) != nullptr;
}

bool add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok == 1;
}

bool add_uri_san(X509* cert, const std::string& uri) {
  X509_EXTENSION* ext = uri_san_extension(uri);
  if (ext == nullptr) return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// EdDSA keys sign without a separate digest.
const EVP_MD* digest_for(EVP_PKEY* key) {
  int id = EVP_PKEY_get_id(key);
  return (id == EVP_PKEY_ED25519 || id == EVP_PKEY_ED448) ? nullptr : EVP_sha256();
}

bool set_times(X509* cert, TimePoint not_before, TimePoint not_after) {
  return ASN1_TIME_set(X509_getm_notBefore(cert), to_time_t(not_before)) != nullptr &&
         ASN1_TIME_set(X509_getm_notAfter(cert), to_time_t(not_after)) != nullptr;
}

Result<X509Ptr> make_root(EVP_PKEY* key, TimePoint now, std::chrono::seconds lifetime) {
  ERR_clear_error();
  X509Ptr cert(X509_new());
  if (!cert) return Error{"out of memory"};
  X509_NAME* name = X509_get_subject_name(cert.get());
  bool ok = X509_set_version(cert.get(), X509_VERSION_3) == 1 && set_random_serial(cert.get()) &&
            X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                       reinterpret_cast<const unsigned char*>("sockmesh"), -1, -1,
                                       0) == 1 &&
            X509_set_issuer_name(cert.get(), name) == 1 &&
            set_times(cert.get(), now - kRootBackdate, now + lifetime) &&
            X509_set_pubkey(cert.get(), key) == 1 &&
            add_ext(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE") &&
            add_ext(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign") &&
            add_ext(cert.get(), cert.get(), NID_subject_key_identifier, "hash") &&
            add_ext(cert.get(), cert.get(), NID_authority_key_identifier, "keyid:always") &&
            X509_sign(cert.get(), key, digest_for(key)) > 0;
  if (!ok) return Error{openssl_error("creating root certificate")};
  return cert;
}

// The state directory must not let anyone else plant files in it: whoever writes ca-key.pem
// first becomes the mesh's CA.
Status prepare_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Error{"creating state directory " + dir.string() + ": " + errno_text(errno)};
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return Error{"state directory " + dir.string() + ": " + errno_text(errno)};
  }
  if (!S_ISDIR(st.st_mode)) return Error{"state directory " + dir.string() + " is not a directory"};
  if (st.st_uid != ::geteuid()) {
    return Error{"state directory " + dir.string() + " is owned by uid " +
                 std::to_string(st.st_uid) + ", not by this process (uid " +
                 std::to_string(::geteuid()) +
                 "); refusing to keep a CA key there (chown it, or choose another --state-dir)"};
  }
  if ((st.st_mode & 022) != 0) {
    // Someone else could have written the key we would load: only an empty directory (a
    // fresh one, created with a loose umask) is tightened and used.
    std::error_code ec;
    if (!std::filesystem::is_empty(dir, ec) || ec) {
      return Error{"state directory " + dir.string() + " is writable by group or others (mode " +
                   std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
                   std::to_string(st.st_mode & 7) +
                   ") and not empty, so its CA files cannot be trusted; refusing (chmod 700 it "
                   "once you have checked them)"};
    }
  }
  if ((st.st_mode & 077) != 0) {
    if (::chmod(dir.c_str(), 0700) != 0) {
      return Error{"restricting state directory " + dir.string() +
                   " to mode 0700: " + errno_text(errno)};
    }
    SM_INFO(kScope) << "restricted state directory to mode 0700 dir=" << dir.string();
  }
  return {};
}

struct Loaded {
  X509Ptr cert;
  EvpPkeyPtr key;
};

Result<Loaded> check_root(const std::filesystem::path& dir, std::string_view cert_pem,
                          std::string_view key_pem, TimePoint now) {
  std::string cert_path = (dir / BuiltinCa::kCertFile).string();
  std::string key_path = (dir / BuiltinCa::kKeyFile).string();
  auto certs = certificates_from_pem(cert_pem);
  if (!certs) return Error{cert_path + ": " + certs.error().message};
  if (certs->size() != 1) {
    return Error{cert_path + ": expected exactly one certificate, found " +
                 std::to_string(certs->size())};
  }
  auto key = private_key_from_pem(key_pem);
  if (!key) return Error{key_path + ": " + key.error().message};
  X509Ptr cert = std::move(certs->front());
  ERR_clear_error();
  if (X509_check_private_key(cert.get(), key->get()) != 1) {
    return Error{openssl_error(key_path + " does not belong to the certificate in " + cert_path)};
  }
  if (X509_check_ca(cert.get()) < 1) {
    return Error{cert_path + " is not a CA certificate (basicConstraints CA:TRUE missing)"};
  }
  if (X509_check_issued(cert.get(), cert.get()) != X509_V_OK ||
      X509_verify(cert.get(), X509_get0_pubkey(cert.get())) != 1) {
    ERR_clear_error();
    return Error{cert_path + " is not a self-signed root"};
  }
  auto not_after = to_time_point(X509_get0_notAfter(cert.get()));
  if (!not_after) return Error{cert_path + ": unreadable notAfter"};
  if (*not_after <= now) {
    return Error{cert_path + ": root expired at " + format_utc(*not_after) + "; move " +
                 dir.string() + " aside to create a new root (every peer must then trust it)"};
  }
  return Loaded{std::move(cert), *std::move(key)};
}

void warn_if_key_exposed(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    SM_WARN(kScope) << "CA key is accessible to group or others; chmod 600 it path="
                    << path.string();
  }
}

}  // namespace

BuiltinCa::BuiltinCa(std::string trust_domain, X509Ptr root, EvpPkeyPtr key,
                     BuiltinCaOptions options, bool created_root)
    : trust_domain_(std::move(trust_domain)),
      key_(std::move(key)),
      roots_([&] {
        auto roots = std::make_shared<X509List>();
        roots->push_back(std::move(root));
        return roots;
      }()),
      root_not_after_(*to_time_point(X509_get0_notAfter(roots_->front().get()))),
      options_(std::move(options)),
      created_root_(created_root) {}

Result<std::shared_ptr<BuiltinCa>> BuiltinCa::load_or_create(const std::filesystem::path& state_dir,
                                                             std::string_view trust_domain,
                                                             BuiltinCaOptions options) {
  if (!valid_trust_domain(trust_domain)) {
    return Error{"invalid trust domain \"" + std::string(trust_domain) + "\""};
  }
  if (options.workload_lifetime.count() <= 0 || options.root_lifetime.count() <= 0 ||
      options.clock_skew.count() < 0) {
    return Error{"builtin CA lifetimes must be positive and clock skew non-negative"};
  }
  if (state_dir.empty()) return Error{"builtin CA needs a state directory"};
  if (auto st = prepare_dir(state_dir); !st) return st.error();

  const std::filesystem::path key_path = state_dir / kKeyFile;
  const std::filesystem::path cert_path = state_dir / kCertFile;
  const TimePoint now = now_from(options.clock);
  bool created = false;

  // Bounded: each retry means another process published a file between our read and our
  // write, after which the next read finds it. Only files deleted concurrently can loop.
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto key_text = files::read(key_path);
    if (!key_text) return key_text.error();
    if (!key_text->has_value() && files::stamp(cert_path)) {
      // Writers publish the key before the certificate, so a certificate without a key means
      // the key was lost, unless a writer finished both between our reads: look once more.
      key_text = files::read(key_path);
      if (!key_text) return key_text.error();
      if (!key_text->has_value()) {
        return Error{key_path.string() + " is missing but " + cert_path.string() +
                     " exists; restore the key, or move the certificate aside to create a new "
                     "root (every peer must then trust it)"};
      }
    }
    if (!key_text->has_value()) {
      auto key = generate_p256();
      if (!key) return key.error();
      std::string pem = private_key_to_pem(key->get());
      auto pub = files::publish_exclusive(state_dir, kKeyFile, pem, 0600);
      if (!pub) return pub.error();
      if (*pub == files::Publish::kAlreadyExists) continue;  // lost the race; load the winner's
      *key_text = std::move(pem);
      created = true;
    }

    auto cert_text = files::read(cert_path);
    if (!cert_text) return cert_text.error();
    if (!cert_text->has_value()) {
      // Either the process that wrote the key is about to write the certificate, or it died in
      // between. Signing a root for the key on disk is right in both cases: only one
      // certificate gets published, and any of them would have the same key and subject.
      auto key = private_key_from_pem(**key_text);
      if (!key) return Error{key_path.string() + ": " + key.error().message};
      auto root = make_root(key->get(), now, options.root_lifetime);
      if (!root) return root.error();
      std::string pem = to_pem(root->get());
      auto pub = files::publish_exclusive(state_dir, kCertFile, pem, 0644);
      if (!pub) return pub.error();
      if (*pub == files::Publish::kAlreadyExists) {
        cert_text = files::read(cert_path);
        if (!cert_text) return cert_text.error();
        if (!cert_text->has_value()) continue;  // deleted again already; start over
      } else {
        *cert_text = std::move(pem);
        created = true;
      }
    }

    auto loaded = check_root(state_dir, **cert_text, **key_text, now);
    if (!loaded) return loaded.error();
    if (!created) warn_if_key_exposed(key_path);
    X509* root = loaded->cert.get();
    SM_INFO(kScope) << (created ? "created" : "loaded")
                    << " builtin CA root dir=" << state_dir.string()
                    << " trust_domain=" << trust_domain << " serial=" << serial_hex(root)
                    << " sha256=" << fingerprint_sha256(root);
    return std::shared_ptr<BuiltinCa>(new BuiltinCa(std::string(trust_domain),
                                                    std::move(loaded->cert), std::move(loaded->key),
                                                    std::move(options), created));
  }
  return Error{"CA files in " + state_dir.string() +
               " keep disappearing while being loaded; is another process deleting them?"};
}

Result<CertifiedKeyPtr> BuiltinCa::issue(const SpiffeId& id) {
  if (id.trust_domain != trust_domain_) {
    return Error{"builtin CA for trust domain \"" + trust_domain_ + "\" cannot issue " +
                 id.to_string()};
  }
  const TimePoint now = now_from(options_.clock);
  TimePoint not_after = std::min(now + options_.workload_lifetime, root_not_after_);
  if (not_after <= now) {
    return Error{"builtin CA root expired at " + format_utc(root_not_after_)};
  }
  auto key = generate_p256();
  if (!key) return key.error();

  ERR_clear_error();
  X509* root = roots_->front().get();
  X509Ptr cert(X509_new());
  if (!cert) return Error{"out of memory"};
  bool ok = X509_set_version(cert.get(), X509_VERSION_3) == 1 && set_random_serial(cert.get()) &&
            X509_set_issuer_name(cert.get(), X509_get_subject_name(root)) == 1 &&
            set_times(cert.get(), now - options_.clock_skew, not_after) &&
            X509_set_pubkey(cert.get(), key->get()) == 1 &&
            add_ext(cert.get(), root, NID_basic_constraints, "critical,CA:FALSE") &&
            add_ext(cert.get(), root, NID_key_usage, "critical,digitalSignature,keyEncipherment") &&
            add_ext(cert.get(), root, NID_ext_key_usage, "serverAuth,clientAuth") &&
            add_ext(cert.get(), root, NID_authority_key_identifier, "keyid:always") &&
            add_uri_san(cert.get(), id.to_string()) &&
            X509_sign(cert.get(), key_.get(), digest_for(key_.get())) > 0;
  if (!ok) return Error{openssl_error("signing certificate for " + id.to_string())};
  return CertifiedKey::create(std::move(cert), X509List{}, *std::move(key));
}

}  // namespace sockmesh::identity
