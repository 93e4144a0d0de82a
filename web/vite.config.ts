import { defineConfig } from 'vite';

// The console is served by the server itself (src/api/console.rs embeds dist/). `npm run dev`
// serves it with hot reload and sends API calls to a server started with `scripts/dev`.
const api = process.env.ASTRAEUS_SERVER ?? 'http://127.0.0.1:8080';

export default defineConfig({
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  build: {
    outDir: 'dist',
    assetsDir: 'assets',
    emptyOutDir: true,
    target: 'es2022',
    // No inline scripts or data: URLs for scripts: the server's Content-Security-Policy is 'self'.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
  },
  server: {
    proxy: { '/api': api, '/openapi.json': api },
  },
});
