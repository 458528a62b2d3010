// Drives the agent's MCP data plane with the official TypeScript MCP SDK
// client (StreamableHTTPClientTransport).
//
//   node mcp_client.mjs BASE_URL TOKEN SERVER SCENARIO [ARGS]
//
// Scenarios print one JSON object on stdout:
//   tools                      the tool names
//   call TOOL JSON_ARGS        the text of one tools/call result
//   concurrent SESSIONS CALLS  SESSIONS sessions x CALLS concurrent
//                              read_text_file calls of f<i>.txt; mismatches
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [base, token, server, scenario, ...args] = process.argv.slice(2);
const url = new URL(`${base}/${server}/mcp/?local_sandbox_id=test`);

async function session() {
  const transport = new StreamableHTTPClientTransport(url, {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: "sandbox-agent-test", version: "1.0.0" });
  await client.connect(transport);
  return { client, transport };
}

const text = (r) => r.content.filter((c) => c.type === "text").map((c) => c.text).join("");

let out;
if (scenario === "tools") {
  const { client, transport } = await session();
  const r = await client.listTools();
  out = { tools: r.tools.map((t) => t.name).sort() };
  await transport.terminateSession();
  await client.close();
} else if (scenario === "call") {
  const { client } = await session();
  const r = await client.callTool({ name: args[0], arguments: JSON.parse(args[1]) });
  out = { is_error: !!r.isError, text: text(r) };
  await client.close();
} else if (scenario === "concurrent") {
  const [sessions, calls] = args.map(Number);
  const bad = [];
  await Promise.all(
    [...Array(sessions).keys()].map(async (k) => {
      const { client } = await session();
      await Promise.all(
        [...Array(calls).keys()].map(async (i) => {
          const n = (k * calls + i) % 50;
          const r = await client.callTool({ name: "read_text_file", arguments: { path: `f${n}.txt` } });
          if (text(r).trim() !== `content ${n}`) bad.push({ session: k, call: i, got: text(r).slice(0, 80) });
        }),
      );
      await client.close();
    }),
  );
  out = { calls: sessions * calls, mismatches: bad };
} else {
  console.error(`unknown scenario ${scenario}`);
  process.exit(2);
}
console.log(JSON.stringify(out));
