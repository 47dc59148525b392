package rules

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/freqring/freqring/internal/suggest"
	"gopkg.in/yaml.v3"
)

// unknownKey walks the YAML tree n against the Go type t it decodes into
// and returns the first mapping key that names no field, as "LINE: unknown
// key "limt" in a rule (did you mean "limit"?)", or with the allowed keys
// when none is close. The allowed keys are the fields' yaml tags, read by
// reflection, so that the message cannot drift from the types. yaml.v3's
// own error (KnownFields) names the Go type instead ("field limt not found
// in type rules.ruleSpec") and no file line of its own. It returns 0, "" when
// every key is known.
func unknownKey(n *yaml.Node, t reflect.Type) (line int, msg string) {
	if n == nil {
		return 0, ""
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if line, msg := unknownKey(c, t); msg != "" {
				return line, msg
			}
		}
		return 0, ""
	case yaml.AliasNode:
		return unknownKey(n.Alias, t)
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return 0, "" // it reads its own node
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if n.Kind == yaml.SequenceNode {
			for _, c := range n.Content {
				if line, msg := unknownKey(c, t.Elem()); msg != "" {
					return line, msg
				}
			}
		}
	case reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 1; i < len(n.Content); i += 2 {
				if line, msg := unknownKey(n.Content[i], t.Elem()); msg != "" {
					return line, msg
				}
			}
		}
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return 0, "" // the decoder names the wrong kind of value
		}
		fields := map[string]reflect.Type{}
		for _, f := range yamlFields(t) {
			fields[f.key] = f.typ
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" && k.Tag == "!!merge" { // a merge key: its mappings' keys are this one's
				if line, msg := unknownKey(v, t); msg != "" {
					return line, msg
				}
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				return k.Line, unknownKeyMsg(k.Value, t)
			}
			if line, msg := unknownKey(v, ft); msg != "" {
				return line, msg
			}
		}
	}
	return 0, ""
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// yamlField is a key of a struct as yaml.v3 reads it, and its value's type.
type yamlField struct {
	key string
	typ reflect.Type
}

// yamlFields lists the keys of struct t in field order, as yaml.v3 reads
// them: the tag's name, else the field's name in lower case; an inline
// struct's keys in its place.
func yamlFields(t reflect.Type) []yamlField {
	var fs []yamlField
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		switch {
		case tag == "-":
		case strings.Contains(","+opts+",", ",inline,") && f.Type.Kind() == reflect.Struct:
			fs = append(fs, yamlFields(f.Type)...)
		case !f.IsExported():
		case name == "":
			fs = append(fs, yamlField{strings.ToLower(f.Name), f.Type})
		default:
			fs = append(fs, yamlField{name, f.Type})
		}
	}
	return fs
}

// sectionNames name the mappings of a rules file in messages.
var sectionNames = map[reflect.Type]string{
	reflect.TypeFor[rulesFile]():           "the rules file",
	reflect.TypeFor[domainSpec]():          "a domain",
	reflect.TypeFor[ruleSpec]():            "a rule",
	reflect.TypeFor[overrideSpec]():        "an override",
	reflect.TypeFor[envoyDomainSpec]():     "an envoy domain",
	reflect.TypeFor[envoyDescriptorSpec](): "an envoy descriptor",
}

// unknownKeyMsg says that key is not one of the keys of struct t: the
// closest key if one is close, else all of them.
func unknownKeyMsg(key string, t reflect.Type) string {
	where := sectionNames[t]
	if where == "" {
		where = t.Name()
	}
	var keys []string
	for _, f := range yamlFields(t) {
		keys = append(keys, f.key)
	}
	if s := suggest.Closest(key, keys); s != "" {
		return fmt.Sprintf("unknown key %q in %s (did you mean %q?)", key, where, s)
	}
	return fmt.Sprintf("unknown key %q in %s; the keys are %s", key, where, strings.Join(keys, ", "))
}
