import http.server, time, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self): self.handle_any()
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0)); self.rfile.read(n); self.handle_any()
    def handle_any(self):
        if self.path.startswith("/slow"):
            time.sleep(float(self.path.split("=")[-1]) if "=" in self.path else 2)
        b = b"ok\n"
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
