#pragma once
// The client a peer proxy names in a CONNECT request's Forwarded header (RFC 7239), for logs.
#include <string>

#include "h2/connection.h"

namespace sockmesh::proxy {

// The value of the `for=` parameter of the request's Forwarded header, without the quotes of a
// quoted-string; empty when there is no such header or parameter.
std::string forwarded_for(const h2::Request& req);

}  // namespace sockmesh::proxy
