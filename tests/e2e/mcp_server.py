"""A small MCP server over Streamable HTTP (JSON-RPC 2.0 POSTs to /mcp), for the Responses
API's MCP tests (tests/responses_mcp.rs, tests/e2e/test_responses.py).

Tools: get_weather(city), add(a, b), broken() (answers isError). `initialize` opens a session
(`Mcp-Session-Id`); every later message must carry it. Each message is recorded (method,
session, Authorization and X-* headers); GET /log answers the record as JSON. With --sse the
answers are SSE streams (a progress notification, then the reply). Prints `listening PORT`
once serving on 127.0.0.1 (HTTPS with --tls-cert and --tls-key). Stops on SIGTERM or when
stdin closes.
"""

import argparse
import itertools
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOLS = [
    {"name": "get_weather", "description": "The weather in a city",
     "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "add", "description": "Adds two numbers",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}},
    {"name": "broken", "description": "Always fails", "inputSchema": {"type": "object", "properties": {}}},
]

LOG = []
SESSIONS = set()
COUNTER = itertools.count(1)
LOCK = threading.Lock()


def call(name, args):
    if name == "get_weather":
        return {"content": [{"type": "text", "text": f"It is 21 C and sunny in {args.get('city', '?')}."}],
                "isError": False}
    if name == "add":
        return {"content": [{"type": "text", "text": str(args.get("a", 0) + args.get("b", 0))}], "isError": False}
    if name == "broken":
        return {"content": [{"type": "text", "text": "the tool broke"}], "isError": True}
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sse = False

    def log_message(self, *args):
        pass

    def answer(self, status, body=None, headers=()):
        data = b"" if body is None else json.dumps(body).encode()
        if body is not None and self.sse and status == 200:
            note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            data = (f"event: message\ndata: {json.dumps(note)}\n\n"
                    f"event: message\ndata: {json.dumps(body)}\n\n").encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if body is not None:
            self.send_header("Content-Type", "text/event-stream" if self.sse and status == 200 else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/log":
            with LOCK:
                sse, self.sse = self.sse, False
                self.answer(200, list(LOG))
                self.sse = sse
        else:
            self.answer(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        msg = json.loads(self.rfile.read(length))
        method = msg.get("method")
        session = self.headers.get("Mcp-Session-Id")
        with LOCK:
            LOG.append({"method": method, "session": session,
                        "authorization": self.headers.get("Authorization"),
                        "headers": {k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-")}})
        if method == "initialize":
            sid = f"sess-{next(COUNTER)}"
            with LOCK:
                SESSIONS.add(sid)
            result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "test-mcp", "version": "1"}}
            return self.answer(200, {"jsonrpc": "2.0", "id": msg["id"], "result": result},
                               headers=[("Mcp-Session-Id", sid)])
        if session not in SESSIONS:
            return self.answer(400, {"jsonrpc": "2.0", "id": msg.get("id"),
                                     "error": {"code": -32600, "message": "no session"}})
        if "id" not in msg:
            return self.answer(202)
        if method == "tools/list":
            return self.answer(200, {"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": TOOLS}})
        if method == "tools/call":
            result = call(msg["params"]["name"], msg["params"].get("arguments") or {})
            if result is None:
                return self.answer(200, {"jsonrpc": "2.0", "id": msg["id"],
                                         "error": {"code": -32602, "message": "unknown tool"}})
            return self.answer(200, {"jsonrpc": "2.0", "id": msg["id"], "result": result})
        return self.answer(200, {"jsonrpc": "2.0", "id": msg["id"],
                                 "error": {"code": -32601, "message": "method not found"}})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--sse", action="store_true")
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM) ...")
    p.add_argument("--tls-key", help="... and this key")
    args = p.parse_args()
    Handler.sse = args.sse
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    if args.tls_cert:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    # A parent that goes away closes our stdin: stop then too.
    threading.Thread(target=lambda: (sys.stdin.read(), server.shutdown()), daemon=True).start()
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
