"""The MCP server (analyzer.mcp.server): runs, reports, diffs and the warehouse as tools for an assistant."""
