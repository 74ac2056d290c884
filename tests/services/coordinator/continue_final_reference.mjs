// transformers' continue_final_message, written out here as the reference for specd's: the
// conversation is rendered by transformers.js (@lenml/tokenizers, with the package's own
// tokenizer_config.json template) without a generation prompt, cut right after the last
// occurrence of the final message's content, or of that content stripped of surrounding
// whitespace where the template trimmed it (as transformers' apply_chat_template does), and
// encoded as apply_chat_template encodes: special tokens in the text recognised, none added.
//
//   node continue_final_reference.mjs NAME 'MESSAGES_JSON'
//
// NAME picks @lenml/tokenizer-NAME. Prints {"text": ..., "ids": [...]}.
const [name, messagesJson] = process.argv.slice(2);
const { fromPreTrained } = await import(`@lenml/tokenizer-${name}`);
const tokenizer = fromPreTrained();
const messages = JSON.parse(messagesJson);
let text = tokenizer.apply_chat_template(messages, {
  add_generation_prompt: false,
  tokenize: false,
});
let content = messages[messages.length - 1].content;
let at = text.lastIndexOf(content);
if (at < 0) {
  content = content.trim();
  at = text.lastIndexOf(content);
}
if (at < 0) {
  console.error("the template does not write the final message's content");
  process.exit(1);
}
text = text.slice(0, at + content.length);
const ids = tokenizer.encode(text, { add_special_tokens: false });
console.log(JSON.stringify({ text, ids }));
