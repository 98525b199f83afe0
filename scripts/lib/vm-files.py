"""HTTPS file server of the VM testbed (scripts/vm-start): serves the current directory on
127.0.0.1:PORT with CERT and KEY. Usage: vm-files.py PORT CERT KEY"""

import http.server
import ssl
import sys

port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
httpd.serve_forever()
