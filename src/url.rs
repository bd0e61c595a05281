//! Percent-encoding of URL query values, as `curl_easy_escape` and client-go do: every byte but
//! RFC 3986's unreserved characters (letters, digits, `-._~`) becomes `%XX`. Label selectors
//! (`=`, `,`, spaces) and metadata keys (`/`, `:`) travel in query strings this way.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

const RESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` ready to stand as a query value.
pub fn encode(s: &str) -> String {
    utf8_percent_encode(s, RESERVED).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_all_but_unreserved_like_curl() {
        assert_eq!(
            super::encode("mooncake/ram/127.0.0.1:12830"),
            "mooncake%2Fram%2F127.0.0.1%3A12830"
        );
        assert_eq!(
            super::encode("app=sglang,tier in (a)~x_y-z"),
            "app%3Dsglang%2Ctier%20in%20%28a%29~x_y-z"
        );
        assert_eq!(super::encode("é"), "%C3%A9");
    }
}
