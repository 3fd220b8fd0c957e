//! The chat prompt format of a GGUF file (`tokenizer.chat_template`), for ChatML templates.
//!
//! The template is Jinja; this module does not run Jinja. It recognizes the ChatML template
//! (`<|im_start|>ROLE\nCONTENT<|im_end|>\n` per message, `<|im_start|>assistant\n` as the
//! generation prompt), which is what SmolLM2's GGUF ships, including its optional clause that
//! inserts a default system message when the conversation does not start with one; other
//! templates are refused by name.

use crate::error::{Error, Result};
use crate::io::gguf::Gguf;

const KEY: &str = "tokenizer.chat_template";
/// The per-message part every ChatML template has.
const CHATML_MESSAGE: &str = "'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'";
/// The generation prompt ChatML adds.
const CHATML_PROMPT: &str = "'<|im_start|>assistant\n'";
/// The clause that starts a conversation without a system message with a default one.
const DEFAULT_SYSTEM_CLAUSE: &str = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n";

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` with `content`.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.to_string(), content: content.to_string() }
    }
}

/// A ChatML template as a GGUF file states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    default_system: Option<String>,
}

impl ChatTemplate {
    /// Reads `tokenizer.chat_template` and recognizes it as ChatML (with its default system
    /// message, if it has one).
    pub fn from_gguf(gguf: &Gguf) -> Result<ChatTemplate> {
        let template = gguf.metadata_string(KEY)?;
        ChatTemplate::parse(&template).map_err(|m| Error::artifact(gguf.path(), Some(KEY), m))
    }

    /// Recognizes `template` as ChatML; the error says why not.
    pub fn parse(template: &str) -> std::result::Result<ChatTemplate, String> {
        if !template.contains(CHATML_MESSAGE) || !template.contains(CHATML_PROMPT) {
            return Err(
                "is not a ChatML template (<|im_start|>role\\ncontent<|im_end|>\\n), the only one served".into()
            );
        }
        let default_system = match template.find(DEFAULT_SYSTEM_CLAUSE) {
            None => None,
            Some(at) => {
                let rest = &template[at + DEFAULT_SYSTEM_CLAUSE.len()..];
                let Some(end) = rest.find("<|im_end|>") else {
                    return Err("has a default system message without its <|im_end|>".into());
                };
                Some(rest[..end].to_string())
            }
        };
        Ok(ChatTemplate { default_system })
    }

    /// The default system message the template inserts, if any.
    pub fn default_system(&self) -> Option<&str> {
        self.default_system.as_deref()
    }

    /// The prompt text of `messages`, followed by the assistant's turn when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        let mut out = String::new();
        let starts_with_system = messages.first().is_some_and(|m| m.role == "system");
        if let (Some(system), false, true) = (&self.default_system, starts_with_system, !messages.is_empty()) {
            out.push_str(&format!("<|im_start|>system\n{system}<|im_end|>\n"));
        }
        for m in messages {
            out.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content));
        }
        if add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as its GGUF file holds it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_smollm2_chatml_with_its_default_system_message() {
        let t = ChatTemplate::parse(SMOLLM2).unwrap();
        let text = t.render(&[ChatMessage::new("user", "Hi")], true);
        assert_eq!(
            text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let own = t.render(&[ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")], false);
        assert_eq!(own, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
        assert!(
            ChatTemplate::parse("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}{% endfor %}").is_err()
        );
    }
}
