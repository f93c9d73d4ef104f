// An MQTT.js (MQTT v5) subscriber behind a load balancer, for tests/real/test_load_balancer_real.py.
//
// usage: node mqttjs_subscriber.js URL CLIENT_ID FILTER QOS RECONNECT_SECONDS
//
// A persistent session (clean: false, a session expiry): subscribes once, at its first connection; MQTT.js
// subscribes again by itself after a connection answered with session present 0 (its `resubscribe` option, on
// by default). Every RECONNECT_SECONDS its TCP connection is destroyed (as a network drop would), and MQTT.js
// connects again: through the load balancer, to another broker. Prints one line per event on stdout:
//   connect <session present 0|1> <ms since the epoch>
//   msg <qos> <dup 0|1> <ms since the epoch> <topic> <payload>
const mqtt = require("mqtt");

const [url, clientId, filter, qos, every] = process.argv.slice(2);
const client = mqtt.connect(url, {
  protocolVersion: 5,
  clientId,
  clean: false,
  properties: { sessionExpiryInterval: 300 },
  reconnectPeriod: 100,
  connectTimeout: 5000,
  keepalive: 30,
});
let subscribed = false;
const out = (line) => process.stdout.write(line + "\n");

client.on("connect", (connack) => {
  out(`connect ${connack.sessionPresent ? 1 : 0} ${Date.now()}`);
  if (!subscribed) {
    subscribed = true;
    client.subscribe(filter, { qos: Number(qos) });
  }
});
client.on("message", (topic, payload, packet) => {
  out(`msg ${packet.qos} ${packet.dup ? 1 : 0} ${Date.now()} ${topic} ${payload.toString()}`);
});
client.on("error", (error) => out(`error ${error.message}`));
setInterval(() => {
  if (client.connected && client.stream) client.stream.destroy();
}, Number(every) * 1000);
process.on("SIGTERM", () => client.end(false, {}, () => process.exit(0)));
