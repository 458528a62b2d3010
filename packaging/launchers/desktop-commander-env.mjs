#!/usr/bin/env node
// Starts desktop-commander with its allowedDirectories set from the
// environment, as MCP_Atlas does right after starting it (its harness
// calls set_config_value allowedDirectories ["/data"]).
//
//   desktop-commander-env.mjs DIST_DIR [ARGS...]
//
// DIST_DIR is desktop-commander's dist/ directory. DC_ALLOWED_DIRECTORIES
// (":"-separated absolute paths) is written through desktop-commander's own
// config manager into its config ($HOME/.claude-server-commander, in the
// lease's home, made fresh at every Acquire); unset, nothing is changed. With
// DC_DISABLE_TELEMETRY=1, telemetryEnabled is set false the same way
// (versions before 0.2.42 read no variable for it, and send usage events
// by default). Then the server starts in this process with ARGS.
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const dist = process.argv[2];
if (!dist) {
    console.error('desktop-commander-env: usage: desktop-commander-env DIST_DIR [ARGS...]');
    process.exit(2);
}
process.argv.splice(2, 1);
const dirs = (process.env.DC_ALLOWED_DIRECTORIES || '').split(':').filter((d) => d !== '');
const bad = dirs.filter((d) => !path.isAbsolute(d));
if (bad.length > 0) {
    console.error(`desktop-commander-env: DC_ALLOWED_DIRECTORIES must hold absolute paths; got ${bad.join(', ')}`);
    process.exit(2);
}
const quiet = process.env.DC_DISABLE_TELEMETRY === '1';
if (dirs.length > 0 || quiet) {
    const { configManager } = await import(pathToFileURL(path.join(dist, 'config-manager.js')).href);
    await configManager.init();
    if (dirs.length > 0) await configManager.setValue('allowedDirectories', dirs);
    if (quiet) await configManager.setValue('telemetryEnabled', false);
}
await import(pathToFileURL(path.join(dist, 'index.js')).href);
