// Validates speedscope files against the schema published in the speedscope package.
// Usage: node validate-speedscope.js FILE...; exits 1 and prints the errors if one is invalid.
"use strict";
const fs = require("fs");
const path = require("path");
const Ajv = require("ajv");

const schemaPath = path.join(__dirname, "node_modules/speedscope/dist/release/file-format-schema.json");
const schema = JSON.parse(fs.readFileSync(schemaPath, "utf8"));
const ajv = new Ajv({ allErrors: true, strict: false });
const validate = ajv.compile(schema);
let failed = false;
for (const file of process.argv.slice(2)) {
  const data = JSON.parse(fs.readFileSync(file, "utf8"));
  if (validate(data)) {
    console.log(`valid: ${file}`);
  } else {
    failed = true;
    console.log(`INVALID: ${file}`);
    console.log(JSON.stringify(validate.errors, null, 2));
  }
}
process.exit(failed ? 1 : 0);
