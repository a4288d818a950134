// Preloaded with NODE_OPTIONS=--require: every net.Server listens on 127.0.0.1 only, and the
// port it got is written to stderr as TRUSS_LISTEN_PORT=<port> (so tests can ask for port 0).
"use strict";
const net = require("net");
const original = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const callback = typeof args[args.length - 1] === "function" ? args.pop() : undefined;
  const first = args[0];
  if (typeof first === "string" && Number.isNaN(Number(first))) {
    return original.call(this, ...args, ...(callback ? [callback] : [])); // a unix socket path
  }
  const options =
    first !== null && typeof first === "object"
      ? { ...first, host: "127.0.0.1" }
      : { port: first === undefined ? 0 : Number(first), host: "127.0.0.1" };
  this.once("listening", () => {
    const address = this.address();
    if (address && typeof address === "object") {
      process.stderr.write(`TRUSS_LISTEN_PORT=${address.port}\n`);
    }
  });
  return callback ? original.call(this, options, callback) : original.call(this, options);
};
